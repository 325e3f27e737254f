#!/usr/bin/env bash
# Fuzzes the mail parser for N seconds (default 60) with cargo-fuzz, starting from fuzz/seeds.
# cargo-fuzz needs nightly compiler flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi
mkdir -p fuzz/corpus/parse_mail
RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none parse_mail fuzz/corpus/parse_mail fuzz/seeds \
  -- -max_total_time="$seconds" -max_len=65536
