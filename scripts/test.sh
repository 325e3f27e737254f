#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs and starts the loopback mail host,
# installs the third-party ACP agents the tests use (Gemini CLI, the TypeScript and Python
# ACP SDKs), runs every test (unit, conformance, runners, agents, end to end over the mail host), then
# fuzzes briefly (each of the five fuzz targets for AAMP_FUZZ_SECONDS, default 15 s). Needs
# root for the mail host (apt-get, Cyrus' master).
#   AAMP_FUZZ_SECONDS=0 scripts/test.sh   skips the fuzz run
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/mailhost.sh need-root scripts/test.sh

bash scripts/mailhost.sh install
# The packaging tests use these (Debian's packages; usually there already).
missing=()
for tool in objdump:binutils man:man-db systemd-analyze:systemd runuser:util-linux dpkg-deb:dpkg; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]} for the packaging tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
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

# tmux drives the init wizard as a person would (tests/wizard.rs).
command -v tmux >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tmux >/dev/null
# A real browser drives the live view (tests/ui.rs) over chromedriver's WebDriver API.
command -v chromedriver >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null

# Third-party ACP agents (npm, PyPI) that the integration tests run against.
bash scripts/test-agents.sh >/dev/null

# Here the mail host is required: a test that cannot have it fails instead of passing unrun
# (which is what a bare `cargo test` on a machine without one does).
AAMP_REQUIRE_MAILHOST=1 cargo test --locked --all-targets

# No process a test started may outlive the suite: agents, scripted CLIs, bridges.
leftover=$(pgrep -af "tests/agents/|tests/hosts/|target/test-agents/|target/debug/aamp-bridge" | grep -v pgrep || true)
if [ -n "$leftover" ]; then
  echo "processes left behind by the tests:" >&2
  echo "$leftover" >&2
  exit 1
fi
echo "no test processes left behind" >&2

if [ "${AAMP_FUZZ_SECONDS:-15}" != 0 ]; then
  bash scripts/fuzz.sh "${AAMP_FUZZ_SECONDS:-15}"
fi
