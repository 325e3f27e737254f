#!/usr/bin/env python3
"""A test agent for fault tests: records each run, can wait, can leave a process behind
that holds its output open, then answers.

    fault_agent.py [--runs FILE] [--wait-for FILE] [--sleep S] [--leave PIDFILE] [--answer TEXT]

--runs FILE      appends this process's pid to FILE, one line per run
--wait-for FILE  waits until FILE exists before answering (so a test decides when it ends)
--sleep S        then sleeps S seconds
--leave PIDFILE  first starts `sleep 1000` in a session of its own (setsid), holding this
                 agent's stdout and stderr, and appends its pid to PIDFILE
"""
import argparse
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--runs")
parser.add_argument("--wait-for")
parser.add_argument("--sleep", type=float, default=0)
parser.add_argument("--leave")
parser.add_argument("--answer", default="done")
args = parser.parse_args()

if args.runs:
    with open(args.runs, "a") as f:
        f.write(f"{os.getpid()}\n")
if args.leave:
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    with open(args.leave, "a") as f:
        f.write(f"{child.pid}\n")
if args.wait_for:
    while not os.path.exists(args.wait_for):
        time.sleep(0.05)
if args.sleep:
    time.sleep(args.sleep)
print(args.answer, flush=True)
