#!/usr/bin/env python3
"""Reads `cargo test --no-run --message-format=json` on stdin and prints one line per test
executable, `NAME PATH`, the longest-running first (so lanes that run them side by side end
together). Durations are what the binaries took on a 2-core machine; a new one counts as
medium."""
import json
import sys

# Seconds each binary took in a full run (scripts/test.sh prints them: "NAME ok in N s").
KNOWN = {
    "replicas": 360, "real_agents": 210, "soak": 140, "faults": 125, "amp": 110, "samp": 85,
    "durability": 80, "e2e": 70, "ui": 60, "trust": 60, "asmtp": 40, "acp": 40,
    "third_party_agents": 40, "wizard": 40, "packaging": 40,
}

def main():
    seen = []
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test") and "bench" not in msg["target"]["kind"]:
            continue
        kind = msg["target"]["kind"][0]
        name = msg["target"]["name"]
        label = name if kind == "test" else f"{kind}-{name}"
        seen.append((KNOWN.get(name if kind == "test" else label, 30), label, msg["executable"]))
    if not seen:
        sys.exit("test-binaries: cargo built no test executable")
    for _, label, exe in sorted(seen, key=lambda s: -s[0]):
        print(label, exe)

main()
