#!/usr/bin/env bash
# Builds what a release ships into target/dist/: the release binary (stripped), the Debian
# package, the tarball with install.sh, and SHA256SUMS (see scripts/package.sh). The binary
# is built against this machine's glibc; the script says which version it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
rm -rf target/dist
bash scripts/package.sh target/release/aamp-bridge target/dist
ls -l target/dist
