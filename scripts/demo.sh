#!/usr/bin/env bash
# The bridge end to end on this machine: starts the loopback mail host with two mailboxes and
# the AAMP test service in front of it (tests/hosts/aamp_host.py: helper API, live streams),
# runs `aamp-bridge start` with the demo "echo" agent, dispatches one task from the other
# mailbox, and prints the agent's answer. Needs root for the mail host.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/mailhost.sh need-root scripts/demo.sh
repo=$PWD

bash scripts/mailhost.sh install
bash scripts/mailhost.sh start demo-agent demo-me
cargo build --quiet --locked
bin=$repo/target/debug/aamp-bridge

dir=${AAMP_DEMO_DIR:-$(mktemp -d /tmp/aamp-demo.XXXXXX)}
mkdir -p "$dir"
umask 077
printf '%s' "${MAILHOST_PASSWORD:-secret}" > "$dir/password"
service_port=${AAMP_DEMO_SERVICE_PORT:-18090}
python3 tests/hosts/aamp_host.py --port "$service_port" --record "$dir/service.jsonl" \
  --jmap "http://127.0.0.1:${MAILHOST_JMAP_PORT:-18080}" --mailhost scripts/mailhost.sh \
  --smtp "127.0.0.1:${MAILHOST_SUBMIT_PORT:-15587}" > "$dir/service.log" 2>&1 &
service=$!
mailbox() { cat <<TOML
[mailboxes.$1]
email = "$2@${MAILHOST_DOMAIN:-example.test}"
jmap_url = "http://127.0.0.1:${MAILHOST_JMAP_PORT:-18080}/.well-known/jmap"
password_file = "password"
smtp_host = "127.0.0.1"
smtp_port = ${MAILHOST_SUBMIT_PORT:-15587}
smtp_security = "plain"    # allowed only because the host is loopback
poll_interval_secs = 1

TOML
}
{
  echo 'state_dir = "state"'
  echo
  mailbox agent demo-agent
  echo "aamp_url = \"http://127.0.0.1:$service_port\"   # live task streams through the AAMP service"
  echo
  mailbox me demo-me
  cat <<TOML
[[agents]]
name = "echo"
mailbox = "agent"
profile = "echo"
allow_from = ["demo-me@${MAILHOST_DOMAIN:-example.test}"]
TOML
} > "$dir/config.toml"

"$bin" --config "$dir/config.toml" start --json > "$dir/events.jsonl" 2> "$dir/bridge.log" &
bridge=$!
trap 'kill $bridge $service 2>/dev/null; wait $bridge $service 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  grep -q '"agent.ready"' "$dir/events.jsonl" && break
  kill -0 $bridge 2>/dev/null || { echo "the bridge stopped; see $dir/bridge.log" >&2; cat "$dir/bridge.log" >&2; exit 1; }
  sleep 0.1
done
echo "bridge running (events: $dir/events.jsonl, log: $dir/bridge.log)" >&2
echo "--- dispatching a task to demo-agent; the echo agent answers with the text it was sent:" >&2
"$bin" --config "$dir/config.toml" dispatch --from me --to "demo-agent@${MAILHOST_DOMAIN:-example.test}" \
  --title "Hello from the demo" --timeout 60 "Hello, agent. This task came to you by mail."
# The echo agent streams nothing, so the service may have received no call at all.
echo "--- the AAMP service received: $(python3 -c 'import json,os,sys; p=sys.argv[1]; print(", ".join(json.loads(l)["action"] for l in open(p)) if os.path.exists(p) else "nothing (the echo agent streams no events)")' "$dir/service.jsonl")" >&2
echo "--- done; config and logs are in $dir" >&2
