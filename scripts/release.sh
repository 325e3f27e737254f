#!/usr/bin/env bash
# Builds what a release ships into target/dist/: the Debian package, the tarball with
# install.sh, and SHA256SUMS (see scripts/package.sh), from a release binary built against
# glibc 2.17 (RHEL 7, Debian 8, Ubuntu 14.04 and later) with cargo-zigbuild and Zig, which it
# installs from crates.io and PyPI when missing (into target/release-tools, kept for the next
# release). AAMP_RELEASE_NATIVE=1 builds against this
# machine's glibc instead (no Zig; the binary then needs that glibc or later). Also the source
# tarball (scripts/source-tarball.sh: the HEAD commit, tests and scripts included) and a Homebrew formula that builds it, for the
# release's files published at AAMP_RELEASE_URL (default: target/dist itself, as file://).
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=2.17
started=$SECONDS
step() { echo "release.sh: $* ($((SECONDS - started)) s so far)" >&2; }
# The tools are kept under target/release-tools, so a second release builds none of them
# again, and nothing goes into the user's own Python (Debian 12's refuses pip anyway).
tools=$PWD/target/release-tools
if [ "${AAMP_RELEASE_NATIVE:-0}" = 1 ]; then
  step "building the release binary (about 10 minutes on 2 cores the first time)"
  cargo build --release --locked
  bin=target/release/aamp-bridge
else
  export PATH=$tools/bin:$PATH
  if ! command -v cargo-zigbuild >/dev/null; then
    step "building cargo-zigbuild into $tools (once; about 5 minutes on 2 cores)"
    cargo install --locked --root "$tools" cargo-zigbuild
  fi
  if ! "$tools/venv/bin/python" -m ziglang version >/dev/null 2>&1; then
    step "installing Zig (PyPI ziglang) into $tools/venv (once)"
    python3 -m venv "$tools/venv"
    "$tools/venv/bin/pip" install --quiet --disable-pip-version-check ziglang
  fi
  # cargo-zigbuild finds Zig as `python3 -m ziglang` when no `zig` is on PATH.
  export PATH=$tools/venv/bin:$PATH
  target=$(rustc -vV | sed -n 's/^host: //p')
  case $target in
    *-linux-gnu) ;;
    *) echo "release.sh: the portable build is for Linux (gnu) hosts; this is $target (set AAMP_RELEASE_NATIVE=1)" >&2; exit 1 ;;
  esac
  step "building the release binary against glibc $baseline (about 10 minutes on 2 cores the first time)"
  cargo zigbuild --release --locked --target "$target.$baseline"
  bin=target/$target/release/aamp-bridge
  needed=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
  if [ "$(printf '%s\n%s\n' "$needed" "$baseline" | sort -V | tail -1)" != "$baseline" ]; then
    echo "release.sh: the binary needs glibc $needed, above the $baseline baseline" >&2
    exit 1
  fi
fi
step "packaging"
rm -rf target/dist
bash scripts/package.sh "$bin" target/dist
version=$("$bin" --version | awk '{print $2}')
src=$(bash scripts/source-tarball.sh target/dist)
sum=$(sha256sum "$src" | cut -d' ' -f1)
(cd target/dist && sha256sum "$(basename "$src")" >> SHA256SUMS)
url=${AAMP_RELEASE_URL:-file://$PWD/target/dist}
sed -e "s|@URL@|$url|g" -e "s|@VERSION@|$version|g" -e "s|@SHA256@|$sum|g" \
  packaging/homebrew/aamp-bridge.rb.in > target/dist/aamp-bridge.rb
ls -l target/dist
step "done"
