#!/usr/bin/env bash
# CI: `sam build` (release build of every function, x86_64) produces every function's bootstrap;
# prints and records their sizes (infra/check_sam_build.py). Arguments are passed on, e.g.
# `--arch arm64` where the aarch64-unknown-linux-gnu Rust target is installed.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash infra/setup.sh
export PATH="$repo/.venv/bin:$PATH"
exec python infra/check_sam_build.py "$@"
