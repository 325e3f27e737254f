#!/usr/bin/env python3
"""Reads `cargo test --no-run --message-format=json` on stdin and prints one line per test
executable, `NAME PATH`, the longest-running first (so lanes that run them side by side end
together). Durations are what the binaries took on a 2-core machine (one full run of the
suite); one not listed took under 20 s."""
import json
import sys

# Seconds each binary took in a full run (scripts/test.sh prints them: "NAME ok in N s").
KNOWN = {
    "real_agents": 420, "replicas": 394, "faults": 273, "packaging": 157, "soak": 147,
    "amp": 110, "durability": 99, "samp": 87, "trust": 67, "e2e": 53, "usage_agents": 170,
    "third_party_agents": 46, "asmtp": 30, "streams_e2e": 23, "wizard": 22, "fast": 21,
    "sdk_peer": 20, "limits": 20, "samp_keys": 20, "results": 19, "replica_restart": 19,
    "usage_show": 10, "budgets": 11, "delegation": 30,
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
        seen.append((KNOWN.get(name if kind == "test" else label, 10), label, msg["executable"]))
    if not seen:
        sys.exit("test-binaries: cargo built no test executable")
    for _, label, exe in sorted(seen, key=lambda s: -s[0]):
        print(label, exe)

main()
