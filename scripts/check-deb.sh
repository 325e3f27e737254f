#!/usr/bin/env bash
# CI's check of the Debian package on the machine itself (as root; the tests install it only
# into a root of their own): builds it from the test build, installs it with apt-get, runs the
# installed command, its man page and its user unit, and removes it again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "check-deb.sh installs a package: run it as root (or with sudo)" >&2; exit 1; }
# Installed (not merely remembered: a removed package with a postrm stays known to dpkg as
# "config-files" until it is purged, and that is no reason to stop).
case "$(dpkg-query -W -f='${Status}' aamp-bridge 2>/dev/null || true)" in
  *" installed")
    echo "check-deb.sh: aamp-bridge is installed as a package already; not touching it" >&2
    exit 1 ;;
esac
[ -x target/debug/aamp-bridge ] || cargo build --locked
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
built=$(bash scripts/package.sh target/debug/aamp-bridge "$work/dist" 2>/dev/null)
deb=${built%%$'\n'*}
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" >/dev/null
test "$(command -v aamp-bridge)" = /usr/bin/aamp-bridge
aamp-bridge --version
# Read whole, then searched: `grep -q` in a pipe would stop the writer early (SIGPIPE).
page=$(man -P cat aamp-bridge)
grep -q "aamp-bridge" <<<"$page"
: > "$work/config.toml"
unit=$(aamp-bridge --config "$work/config.toml" service render)
grep -q "ExecStart=" <<<"$unit"
mkdir -m 700 "$work/runtime"
XDG_RUNTIME_DIR=$work/runtime systemd-analyze verify --user /usr/lib/systemd/user/aamp-bridge.service
# A person's first steps: `init` from answers, against a mailbox of the local mail host,
# then `service install` (enabling needs a systemd user manager, which this machine does not
# run: the unit is written, and checked).
bash scripts/mailhost.sh start >/dev/null
user=deb-$(date +%s%N)
bash scripts/mailhost.sh adduser "$user" >/dev/null
eval "$(bash scripts/mailhost.sh env)"
cat > "$work/answers.json" <<JSON
{"state_dir": "state", "agents": [{"name": "mine", "profile": "echo", "allow_from": ["boss@$MAILHOST_DOMAIN"],
  "mailbox": {"kind": "existing", "email": "$user@$MAILHOST_DOMAIN", "password": "$MAILHOST_PASSWORD",
              "jmap_url": "$MAILHOST_JMAP_URL", "smtp_host": "127.0.0.1", "smtp_port": $MAILHOST_SMTP_PORT,
              "smtp_security": "plain"}}]}
JSON
export HOME=$work/home XDG_CONFIG_HOME=$work/home/.config
aamp-bridge init --non-interactive --answers "$work/answers.json" >/dev/null
aamp-bridge service install >/dev/null 2>&1 || true
XDG_RUNTIME_DIR=$work/runtime systemd-analyze verify --user "$XDG_CONFIG_HOME/systemd/user/aamp-bridge.service"
grep -q "ExecStart=/usr/bin/aamp-bridge --config $XDG_CONFIG_HOME/aamp-bridge/config.toml start" \
  "$XDG_CONFIG_HOME/systemd/user/aamp-bridge.service"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq aamp-bridge >/dev/null
if [ -e /usr/bin/aamp-bridge ] || [ -e /usr/share/man/man1/aamp-bridge.1.gz ]; then
  echo "check-deb.sh: files are left after removing the package" >&2
  exit 1
fi
# Purged, dpkg forgets it: the next run (or a reinstall) starts from nothing.
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq aamp-bridge >/dev/null
left=$(dpkg-query -W -f='${Status}' aamp-bridge 2>/dev/null || true)
case "$left" in
  "" | *not-installed) ;;
  *) echo "check-deb.sh: dpkg still has aamp-bridge after a purge ($left)" >&2; exit 1 ;;
esac
echo "check-deb.sh: the .deb installs, runs and removes cleanly"
