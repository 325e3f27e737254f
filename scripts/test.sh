#!/usr/bin/env bash
# The test suite, in three tiers:
#   scripts/test.sh --fast   unit tests, the in-process tier, parsers, the fuzz targets' saved
#                            inputs replayed, the layering check, the manual's links: no root,
#                            no mail host, no network (under a minute after the build)
#   scripts/test.sh          everything CI runs: the fast tier plus runners, agents and end to
#                            end over the loopback mail host. Needs root the first time: it
#                            installs and starts the mail host (Cyrus, Postfix, OpenDKIM; two
#                            mail domains), tmux, Chromium
#                            and its driver, and the third-party agents from npm and PyPI.
#   scripts/test.sh --long   the full suite, then fuzzing (each of the five fuzz targets for
#                            AAMP_FUZZ_SECONDS, default 120 s)
# The test binaries of the full suite run side by side in AAMP_TEST_LANES lanes (default 3),
# longest first; each binary's output is shown whole when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

tier=full
case "${1:-}" in
  --fast) tier=fast ;;
  --long) tier=long ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--fast | --long]" >&2; exit 2 ;;
esac

# The fast tier's test binaries: none needs the mail host, root or the network.
fast_tests=(fast inprocess conformance roundtrip layers sizes docs fuzz_replay streams)
if [ "$tier" = fast ]; then
  args=(--lib)
  for t in "${fast_tests[@]}"; do args+=(--test "$t"); done
  exec cargo test --locked "${args[@]}"
fi

bash scripts/mailhost.sh need-root scripts/test.sh
bash scripts/mailhost.sh install
# The packaging tests use these (Debian's packages; usually there already).
missing=()
for tool in objdump:binutils man:man-db systemd-analyze:systemd runuser:util-linux dpkg-deb:dpkg tmux:tmux chromedriver:chromium-driver; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  # tmux drives the init wizard as a person would (tests/wizard.rs); Chromium and its driver
  # drive the live view (tests/ui.rs) over WebDriver.
  echo "test.sh: installing ${missing[*]} for the tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
started_here=0
if ! bash scripts/mailhost.sh check >/dev/null 2>&1; then
  bash scripts/mailhost.sh start
  started_here=1
fi
logs=$(mktemp -d)
on_exit() {
  status=$?
  if [ "$status" != 0 ]; then
    echo "--- tests failed; the mail host's logs end with:" >&2
    tail -n 40 "${MAILHOST_DIR:-/tmp/aamp-mailhost}"/log/{postfix.log,syslog.log} \
      "${MAILHOST2_DIR:-${MAILHOST_DIR:-/tmp/aamp-mailhost}2}"/log/postfix.log 2>/dev/null >&2 || true
  fi
  if [ "$started_here" = 1 ]; then bash scripts/mailhost.sh stop; fi
  rm -rf "$logs"
  exit "$status"
}
trap on_exit EXIT

# Third-party ACP agents (npm, PyPI) that the integration tests run against.
bash scripts/test-agents.sh >/dev/null

# Build every test binary first, then run them side by side.
cargo test --locked --all-targets --no-run --message-format=json-render-diagnostics \
  | python3 scripts/test-binaries.py >"$logs/binaries"

# Here the mail host is required: a test that cannot have it fails instead of passing unrun
# (which is what a bare `cargo test` on a machine without one does).
export AAMP_REQUIRE_MAILHOST=1
lanes=${AAMP_TEST_LANES:-3}
run_one() {
  # $1: name, $2: executable. Prints the binary's output whole, then one summary line.
  local name=$1 exe=$2 started=$SECONDS status=0
  "$exe" >"$logs/$name.log" 2>&1 </dev/null || status=$?
  {
    cat "$logs/$name.log"
    echo "test.sh: $name $( [ $status = 0 ] && echo ok || echo FAILED ) in $((SECONDS - started)) s"
  } 2>&1
  return $status
}
export -f run_one
export logs CARGO_MANIFEST_DIR=$PWD
set +e
xargs -P "$lanes" -L 1 bash -c 'run_one "$0" "$1"' <"$logs/binaries"
status=$?
set -e
read -r passed failed < <(grep -h '^test result:' "$logs"/*.log \
  | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/' \
  | awk '{p+=$1; f+=$2} END {print p+0, f+0}')
echo "tests: $passed passed, $failed failed"
if [ "$status" != 0 ] || [ "$failed" != 0 ]; then
  # Why each test failed, again at the end (a CI page that shows only the tail still says it):
  # the first lines of each failure's own message.
  for log in $(grep -l 'panicked' "$logs"/*.log); do
    awk -v bin="$(basename "$log" .log)" '
      function flush(   i) {
        if (n == 0) return
        for (i = 1; i <= n; i++)
          if (i <= 12 || i > n - 20) print "    " substr(block[i], 1, 300)
          else if (i == 13) print "    [...]"
        n = 0
      }
      /^---- .* stdout ----$/ { flush(); name = $2; inside = 0; next }
      /^failures:$/ || /^test result:/ { flush(); inside = 0; next }
      /panicked at/ && name != "" { flush(); print "test.sh: " bin "::" name ": " $0; inside = 1; next }
      /^stack backtrace:$/ { skip = 1; next }
      skip && /^note: Some details/ { skip = 0; next }
      skip { next }
      inside { block[++n] = $0 }
      END { flush() }
    ' "$log" >&2
  done
  echo "test.sh: failed: $(grep -l 'FAILED\|panicked' "$logs"/*.log | xargs -n1 basename 2>/dev/null | tr '\n' ' ')" >&2
  exit 1
fi

# No process a test started may outlive the suite: agents, scripted CLIs, bridges.
leftover=$(pgrep -af "tests/agents/|tests/hosts/|target/test-agents/|target/debug/aamp-bridge" | grep -v pgrep || true)
if [ -n "$leftover" ]; then
  echo "processes left behind by the tests:" >&2
  echo "$leftover" >&2
  exit 1
fi
echo "no test processes left behind" >&2

if [ "$tier" = long ]; then
  bash scripts/fuzz.sh "${AAMP_FUZZ_SECONDS:-120}"
fi
