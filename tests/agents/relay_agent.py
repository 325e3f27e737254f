#!/usr/bin/env python3
"""A test agent that hands its task on to another agent, as an agent with a mail tool might:
records its run and the hop count it was given (AAMP_BRIDGE_HOPS), then runs
`aamp-bridge dispatch --no-wait` from its own mailbox to TARGET. Two of them pointing at
each other make a loop.

    relay_agent.py BRIDGE CONFIG MAILBOX TARGET RUNS_FILE
"""
import os
import subprocess
import sys

bridge, config, mailbox, target, runs = sys.argv[1:6]
with open(runs, "a") as f:
    f.write(os.environ.get("AAMP_BRIDGE_HOPS", "?") + "\n")
subprocess.run(
    [bridge, "--config", config, "dispatch", "--from", mailbox, "--to", target,
     "--no-wait", "--title", "relay", "pass it on"],
    check=True,
    stdout=subprocess.DEVNULL,
)
print("passed on")
