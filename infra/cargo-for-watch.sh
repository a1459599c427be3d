#!/usr/bin/env bash
# cargo, as `cargo lambda watch` runs it (infra/run-local.sh sets it as its CARGO): for every
# function instance watch runs `cargo run --bin NAME`, whose freshness check alone costs ~0.4 s of
# CPU, 192 times for the stack's 32 instances of 6 functions. Here an instance starts the binary
# run-local.sh has just built, unless a source is newer than it (then cargo runs, and rebuilds,
# as watch's reload expects). Every other cargo command is cargo's.
set -euo pipefail
real="${CHAT_REAL_CARGO:?run by infra/run-local.sh}"
if [[ "${1:-}" == run ]]; then
  bin="" prev=""
  for a in "$@"; do
    [[ "$prev" == --bin ]] && bin="$a"
    prev="$a"
  done
  exe="${CHAT_BIN_DIR:?}/$bin"
  if [[ -n "$bin" && -x "$exe" ]]; then
    newer=$(find "$CHAT_REPO/crates" "$CHAT_REPO/functions" "$CHAT_REPO/Cargo.toml" -newer "$exe" \
      \( -name '*.rs' -o -name Cargo.toml \) -print -quit 2>/dev/null || true)
    [[ -z "$newer" ]] && exec "$exe"
  fi
fi
exec "$real" "$@"
