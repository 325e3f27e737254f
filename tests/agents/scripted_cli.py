#!/usr/bin/env python3
"""A stand-in for an agent CLI (claude, codex, gemini, ...): reads its prompt from stdin,
prints a recorded stream, writes to stderr and exits as told. Tests use it in profiles.

    scripted_cli.py [FIXTURE] [--exit N] [--stderr TEXT] [--linger SECONDS] [--record FILE]
                    [--hang-if-resumed PIDFILE]

--hang-if-resumed: when run with a resume flag (--resume, --session, --session-id, -r), starts
a child (`sleep`, in its process group, as an agent starts helpers), appends both pids to
PIDFILE and waits forever, as an agent that does not know the flag and waits for input would.

--record writes {"argv": [...], "stdin": "..."} to FILE (appending one JSON line per run).
Any other arguments (the real CLI's flags) are accepted and recorded.
"""
import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("fixture", nargs="?")
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--stderr", default="")
parser.add_argument("--linger", type=float, default=0)
parser.add_argument("--record")
parser.add_argument("--hang-if-resumed")
args, _unknown = parser.parse_known_args()

RESUME_FLAGS = {"--resume", "--session", "--session-id", "-r"}
if args.hang_if_resumed and RESUME_FLAGS & set(sys.argv[1:]):
    import subprocess

    child = subprocess.Popen(["sleep", "300"])
    with open(args.hang_if_resumed, "a") as f:
        f.write("%d %d\n" % (os.getpid(), child.pid))
    while True:
        time.sleep(60)

prompt = sys.stdin.read()
if args.record:
    with open(args.record, "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "stdin": prompt}) + "\n")
if args.fixture:
    with open(args.fixture) as f:
        for line in f:
            sys.stdout.write(line)
            sys.stdout.flush()
if args.stderr:
    sys.stderr.write(args.stderr + "\n")
    sys.stderr.flush()
if args.linger:
    time.sleep(args.linger)
sys.exit(args.exit)
