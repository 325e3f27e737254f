#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs and starts the loopback mail host, runs
# every test (unit, conformance, runner, end to end over the mail host), then fuzzes the mail
# parser briefly. Needs root for the mail host (apt-get, Cyrus' master).
#   AAMP_FUZZ_SECONDS=0 scripts/test.sh   skips the fuzz run (default 30 s)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/mailhost.sh install
started_here=0
if ! bash scripts/mailhost.sh check >/dev/null 2>&1; then
  bash scripts/mailhost.sh start
  started_here=1
fi
on_exit() {
  status=$?
  if [ "$status" != 0 ]; then
    echo "--- tests failed; the mail host's logs end with:" >&2
    tail -n 40 "${MAILHOST_DIR:-/tmp/aamp-mailhost}"/log/{postfix.log,syslog.log} 2>/dev/null >&2 || true
  fi
  if [ "$started_here" = 1 ]; then bash scripts/mailhost.sh stop; fi
  exit "$status"
}
trap on_exit EXIT

cargo test --locked --all-targets

if [ "${AAMP_FUZZ_SECONDS:-30}" != 0 ]; then
  bash scripts/fuzz.sh "${AAMP_FUZZ_SECONDS:-30}"
fi
