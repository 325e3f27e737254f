#!/usr/bin/env bash
# Builds what a release ships into target/dist/: the Debian package, the tarball with
# install.sh, and SHA256SUMS (see scripts/package.sh), from a release binary built against
# glibc 2.17 (RHEL 7, Debian 8, Ubuntu 14.04 and later) with cargo-zigbuild and Zig, which it
# installs from crates.io and PyPI when missing. AAMP_RELEASE_NATIVE=1 builds against this
# machine's glibc instead (no Zig; the binary then needs that glibc or later). Also the source
# tarball (`cargo package`, from a clean tree) and a Homebrew formula that builds it, for the
# release's files published at AAMP_RELEASE_URL (default: target/dist itself, as file://).
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=2.17
if [ "${AAMP_RELEASE_NATIVE:-0}" = 1 ]; then
  cargo build --release --locked
  bin=target/release/aamp-bridge
else
  command -v cargo-zigbuild >/dev/null || cargo install --locked cargo-zigbuild
  python3 -m ziglang version >/dev/null 2>&1 || python3 -m pip install --quiet ziglang
  target=$(rustc -vV | sed -n 's/^host: //p')
  case $target in
    *-linux-gnu) ;;
    *) echo "release.sh: the portable build is for Linux (gnu) hosts; this is $target (set AAMP_RELEASE_NATIVE=1)" >&2; exit 1 ;;
  esac
  cargo zigbuild --release --locked --target "$target.$baseline"
  bin=target/$target/release/aamp-bridge
  needed=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
  if [ "$(printf '%s\n%s\n' "$needed" "$baseline" | sort -V | tail -1)" != "$baseline" ]; then
    echo "release.sh: the binary needs glibc $needed, above the $baseline baseline" >&2
    exit 1
  fi
fi
rm -rf target/dist
bash scripts/package.sh "$bin" target/dist
version=$("$bin" --version | awk '{print $2}')
cargo package --locked --no-verify >/dev/null
cp "target/package/aamp-bridge-$version.crate" "target/dist/aamp-bridge-$version-src.tar.gz"
sum=$(sha256sum "target/dist/aamp-bridge-$version-src.tar.gz" | cut -d' ' -f1)
(cd target/dist && sha256sum "aamp-bridge-$version-src.tar.gz" >> SHA256SUMS)
url=${AAMP_RELEASE_URL:-file://$PWD/target/dist}
sed -e "s|@URL@|$url|g" -e "s|@VERSION@|$version|g" -e "s|@SHA256@|$sum|g" \
  packaging/homebrew/aamp-bridge.rb.in > target/dist/aamp-bridge.rb
ls -l target/dist
