#!/usr/bin/env bash
# The source tarball of a release: every file of the commit (HEAD), tests, scripts and fuzz
# targets included, so `scripts/test.sh` runs from it as from a clone. Prints its path.
#   scripts/source-tarball.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/source-tarball.sh OUT_DIR}
command -v git >/dev/null && git rev-parse --git-dir >/dev/null 2>&1 ||
  { echo "$0: needs the git clone (the tarball is made from its HEAD commit)" >&2; exit 1; }
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "$0: note: uncommitted changes are not in the tarball (it is HEAD, $(git rev-parse --short HEAD))" >&2
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mkdir -p "$out"
file="$out/aamp-bridge-$version-src.tar.gz"
git archive --format=tar.gz --prefix="aamp-bridge-$version/" -o "$file" HEAD
echo "$file"
