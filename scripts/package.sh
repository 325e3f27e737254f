#!/usr/bin/env bash
# Packages a built aamp-bridge binary for people without a Rust toolchain:
#
#   scripts/package.sh BINARY OUT_DIR
#
# writes into OUT_DIR
#   - aamp-bridge_VERSION_ARCH.deb: /usr/bin/aamp-bridge, the man page, bash/zsh/fish
#     completions, the systemd user unit in /usr/lib/systemd/user/, the built-in profiles
#     (as examples) and the README, with a libc6 dependency from the GLIBC versions the
#     binary needs;
#   - aamp-bridge-VERSION-linux-ARCH.tar.gz: the same files and install.sh, which installs
#     them under ~/.local (or --prefix) without root after checking the tarball's checksum;
#   - SHA256SUMS for both.
# scripts/release.sh builds the release binary and calls this; the tests call it on the
# debug binary. Needs dpkg-deb, gzip, sha256sum and objdump (binutils).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BINARY OUT_DIR" >&2; exit 2; }
bin=$(realpath "$1")
out=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
for tool in dpkg-deb gzip sha256sum objdump; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is missing (apt-get install dpkg binutils coreutils gzip)" >&2; exit 1; }
done
mkdir -p "$out"
out=$(realpath "$out")
version=$("$bin" --version | awk '{print $2}')
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The files both packages carry, under a prefix ($1: usr for the .deb, . for the tarball).
stage() {
  local root=$1 prefix=$2
  install -Dm755 "$bin" "$root/$prefix/bin/aamp-bridge"
  # One page per command and subcommand (aamp-bridge-start.1 …), as the top page names them.
  rm -rf "$work/man" && "$bin" man --dir "$work/man"
  for page in "$work"/man/*.1; do
    gzip -9n < "$page" > "$page.gz"
    install -Dm644 "$page.gz" "$root/$prefix/share/man/man1/$(basename "$page").gz"
  done
  "$bin" completions bash > "$work/bash"
  "$bin" completions zsh > "$work/zsh"
  "$bin" completions fish > "$work/fish"
  install -Dm644 "$work/bash" "$root/$prefix/share/bash-completion/completions/aamp-bridge"
  install -Dm644 "$work/zsh" "$root/$prefix/share/zsh/vendor-completions/_aamp-bridge"
  install -Dm644 "$work/fish" "$root/$prefix/share/fish/vendor_completions.d/aamp-bridge.fish"
  for p in "$repo"/profiles/*.toml; do
    install -Dm644 "$p" "$root/$prefix/share/aamp-bridge/profiles/$(basename "$p")"
  done
  install -Dm644 "$repo/README.md" "$root/$prefix/share/doc/aamp-bridge/README.md"
  # The images the README links, where its relative links find them.
  for image in "$repo"/docs/*.png; do
    install -Dm644 "$image" "$root/$prefix/share/doc/aamp-bridge/docs/$(basename "$image")"
  done
}

# The user unit for everyone: the packaged binary, the default config, a PATH that finds
# agents installed with npm or pipx in the usual places.
unit() {
  local exe=$1
  sed -e "s|^# aamp-bridge as a systemd user service.*|# aamp-bridge as a systemd user service (installed by the package). Enable it with|" \
      -e "s|^# placeholders (names in double braces).*|# \`systemctl --user enable --now aamp-bridge\` after \`aamp-bridge init\`.|" \
      -e "s|{{exe}} --config {{config}} start|$exe start|" \
      -e "s|{{path}}|%h/.local/bin:%h/.npm-global/bin:/usr/local/bin:/usr/bin:/bin|" \
      -e "s|^# The PATH of the shell that installed the service, so agents installed with npm, npx, nvm|# A PATH that finds agents in the usual places (~/.local/bin, npm's ~/.npm-global);|" \
      -e "s|^# or pipx are found as they are in that shell.|# \\\`aamp-bridge service install\\\` writes a unit with your shell's own PATH instead.|" \
      "$repo/systemd/aamp-bridge.service"
}

# The Debian package.
deb=$work/deb
stage "$deb" usr
mkdir -p "$deb/usr/lib/systemd/user" "$deb/DEBIAN"
unit /usr/bin/aamp-bridge > "$deb/usr/lib/systemd/user/aamp-bridge.service"
chmod 644 "$deb/usr/lib/systemd/user/aamp-bridge.service"
cat > "$deb/usr/share/doc/aamp-bridge/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: aamp-bridge

Files: *
Copyright: the aamp-bridge developers; the binary also holds the Rust crates Cargo.lock names,
 each under its own MIT, Apache-2.0, BSD or ISC licence, all of which allow this distribution
License: MIT OR Apache-2.0
 On Debian systems the Apache License 2.0 is in /usr/share/common-licenses/Apache-2.0. MIT:
 permission is granted, free of charge, to deal in the software without restriction,
 provided the copyright notice and this permission notice are kept in copies.
EOF
size=$(du -sk "$deb/usr" | cut -f1)
cat > "$deb/DEBIAN/control" <<EOF
Package: aamp-bridge
Version: $version
Architecture: $arch
Maintainer: aamp-bridge developers <aamp-bridge@localhost>
Installed-Size: $size
Depends: libc6 (>= $glibc)
Section: utils
Priority: optional
Description: tasks by mail for the coding agents on this machine
 aamp-bridge connects Claude Code, Codex, Gemini CLI and any ACP agent or command-line
 agent to mailboxes (AAMP: email with X-AAMP-* headers over JMAP and SMTP), so that
 workflows, other agents and people can hand them work by mail and get results back.
 Run "aamp-bridge init", then "aamp-bridge start" or the systemd user service.
 The agents are not included; most install with npm and need Node.js 20 or newer (22 for
 Qwen Code), newer than Debian 11's nodejs package.
EOF
# Removing the package stops and disables the bridge of each logged-in user whose unit runs
# the package's binary (packaging/debian/prerm says how), and postrm removes the enable links
# left pointing at the removed unit.
install -m755 "$repo/packaging/debian/prerm" "$deb/DEBIAN/prerm"
cat > "$deb/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = purge ]; then
  for dir in /etc/systemd/user /root/.config/systemd/user /home/*/.config/systemd/user; do
    [ -d "$dir" ] || continue
    find "$dir" -maxdepth 2 -type l -name aamp-bridge.service \
      -lname '*/lib/systemd/user/aamp-bridge.service' ! -exec test -e {} \; -delete 2>/dev/null || true
  done
fi
exit 0
SCRIPT
chmod 755 "$deb/DEBIAN/prerm" "$deb/DEBIAN/postrm"
# What dpkg --verify checks the installed files against.
(cd "$deb" && find usr -type f -print0 | sort -z | xargs -0 md5sum > DEBIAN/md5sums)
debfile=$out/aamp-bridge_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$deb" "$debfile" >/dev/null

# The tarball, with its installer.
name=aamp-bridge-$version-linux-$arch
tree=$work/tar/$name
stage "$tree" .
unit '%h/.local/bin/aamp-bridge' > "$tree/aamp-bridge.service"
install -m755 "$repo/scripts/install.sh" "$tree/install.sh"
(cd "$tree" && find . -type f ! -name SHA256SUMS ! -name install.sh -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
tarball=$out/$name.tar.gz
tar -C "$work/tar" --owner=0 --group=0 -czf "$tarball" "$name"

(cd "$out" && sha256sum "$(basename "$debfile")" "$(basename "$tarball")" > SHA256SUMS)
echo "$debfile"
echo "$tarball"
echo "needs glibc >= $glibc; binary $(du -h "$bin" | cut -f1)" >&2
