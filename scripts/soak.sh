#!/usr/bin/env bash
# The soak of issue 31 (tests/soak.rs), for SECONDS (default 3600: an hour; about two minutes
# more to drain and count): two replicas of one agent mailbox on a private mail host, a
# dispatcher sending AAMP_SOAK_RATE dispatches a second (default 2), and every minute a
# `kill -9` of one replica, every third minute a 45 s SMTP cut, one mail-host restart, hostile
# mail every 3 s (strangers' dispatches, forged cancels, forged delivery reports) and duplicate
# deliveries. Prints dispatched / exactly once / twice / lost, p50/p99 dispatch->result with
# and without faults, each replica's memory and open files every 5 s, journal bytes per task
# and idle CPU; fails on a lost or doubled answer, a panic, or growth. CI runs the same test
# for 100 s in the debug build (`cargo test`). Needs root for the mail host (apt-get, Cyrus'
# master), as scripts/test.sh does.
#   scripts/soak.sh            an hour, release build
#   scripts/soak.sh 600        ten minutes
#   AAMP_SOAK_KEEP_LOGS=1 scripts/soak.sh 300   keeps the replicas' logs (kept anyway on failure)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/mailhost.sh need-root scripts/soak.sh
secs="${1:-3600}"
case "$secs" in
  '' | *[!0-9]*) echo "usage: scripts/soak.sh [SECONDS]" >&2; exit 2 ;;
esac

bash scripts/mailhost.sh install
started_here=0
if ! bash scripts/mailhost.sh check >/dev/null 2>&1; then
  bash scripts/mailhost.sh start
  started_here=1
fi
on_exit() {
  status=$?
  if [ "$started_here" = 1 ]; then bash scripts/mailhost.sh stop; fi
  exit "$status"
}
trap on_exit EXIT

AAMP_REQUIRE_MAILHOST=1 AAMP_SOAK_SECS="$secs" cargo test --release --locked --test soak -- --nocapture
