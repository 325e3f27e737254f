#!/usr/bin/env python3
"""A CLI test agent that asks its dispatcher (profile `help_lines = true`): prints
`HELP: Which colour? | red | blue`, reads the answer as one line of stdin, and answers
`chose <answer>` (or `no answer` for an empty line)."""
import sys

print("HELP: Which colour? | red | blue", flush=True)
answer = sys.stdin.readline().strip()
print(f"chose {answer}" if answer else "no answer", flush=True)
