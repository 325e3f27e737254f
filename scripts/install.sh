#!/usr/bin/env bash
# Installs aamp-bridge from this unpacked tarball, without root: the binary, its man page,
# shell completions, the manual and a systemd user unit, under ~/.local (or --prefix DIR).
# Every file is checked against SHA256SUMS first; nothing is written if one differs.
#
#   ./install.sh [--prefix DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=$HOME/.local
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$here"
if ! sha256sum --quiet --check SHA256SUMS; then
  echo "install.sh: the files above do not match SHA256SUMS; download the tarball again" >&2
  exit 1
fi
# The binary must run here before anything is written: one built against a newer glibc than
# this system's fails at once ("GLIBC_2.xx not found"), and installing it would leave a
# command that cannot start.
if ! said=$(bin/aamp-bridge --version 2>&1); then
  need=$(grep -o 'GLIBC_[0-9.]*' <<<"$said" | sed 's/GLIBC_//' | sort -uV | tail -1 || true)
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' || true)
  echo "install.sh: nothing installed: bin/aamp-bridge does not run on this system:" >&2
  printf '  %s\n' "$said" >&2
  if [ -n "$need" ]; then
    echo "install.sh: it needs glibc $need or newer; this system has ${have:-an older one}. use a system with that glibc, or build aamp-bridge here from source (cargo build --release)" >&2
  fi
  exit 1
fi
install -Dm755 bin/aamp-bridge "$prefix/bin/aamp-bridge"
for page in share/man/man1/*.1.gz; do
  install -Dm644 "$page" "$prefix/share/man/man1/$(basename "$page")"
done
# bash-completion reads ~/.local/share/bash-completion/completions by itself; fish reads
# ~/.config/fish/completions (its vendor folders are the system's); zsh reads only its fpath.
install -Dm644 share/bash-completion/completions/aamp-bridge "$prefix/share/bash-completion/completions/aamp-bridge"
install -Dm644 share/zsh/vendor-completions/_aamp-bridge "$prefix/share/zsh/site-functions/_aamp-bridge"
if [ "$prefix" = "$HOME/.local" ]; then
  install -Dm644 share/fish/vendor_completions.d/aamp-bridge.fish "${XDG_CONFIG_HOME:-$HOME/.config}/fish/completions/aamp-bridge.fish"
else
  install -Dm644 share/fish/vendor_completions.d/aamp-bridge.fish "$prefix/share/fish/vendor_completions.d/aamp-bridge.fish"
fi
mkdir -p "$prefix/share/aamp-bridge" "$prefix/share/doc"
cp -r share/aamp-bridge/profiles "$prefix/share/aamp-bridge/"
# The manual, whole: its pages link each other and docs/live-view.png.
rm -rf "$prefix/share/doc/aamp-bridge"
cp -r share/doc/aamp-bridge "$prefix/share/doc/"
if [ "$prefix" = "$HOME/.local" ]; then
  install -Dm644 aamp-bridge.service "${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user/aamp-bridge.service"
fi
echo "installed aamp-bridge $("$prefix/bin/aamp-bridge" --version | awk '{print $2}') in $prefix"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "add $prefix/bin to your PATH (in ~/.profile: export PATH=\"$prefix/bin:\$PATH\")" ;;
esac
if [ "$(basename "${SHELL:-}")" = zsh ]; then
  echo "zsh completions: add  fpath=($prefix/share/zsh/site-functions \$fpath)  before compinit in ~/.zshrc"
fi
echo "next: aamp-bridge init   (then: aamp-bridge start, or aamp-bridge service install)"
