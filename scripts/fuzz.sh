#!/usr/bin/env bash
# Fuzzes each target for N seconds (default 60) with cargo-fuzz, starting from fuzz/seeds:
# parse_mail (the mail reader and AAMP parser), render_reply (the renderer fed with hostile
# inbound values), stream_lines (an agent's stdout through every stream format) and
# profile_parse (profile files and text-form sender policies) and config_load (the config
# loader and writer, and init answers). Crashes land in
# fuzz/artifacts/TARGET; add them to fuzz/seeds or tests/fixtures/fuzz-regressions.
# cargo-fuzz needs nightly compiler flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi
for target in parse_mail render_reply stream_lines profile_parse config_load; do
  mkdir -p "fuzz/corpus/$target"
  RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none "$target" "fuzz/corpus/$target" fuzz/seeds \
    -- -max_total_time="$seconds" -max_len=65536
done
