#!/usr/bin/env bash
# Runs all tests. Installs what they need first (infra/setup.sh): the pinned emulator, cfn-lint,
# aws-sam-cli.
#   - the emulator launcher's own checks (infra/test_moto_server.py)
#   - template.yaml: one source of truth with the cargo-lambda router, cfn-lint, sam validate
#     --lint (infra/test_template.py)
#   - Rust unit and integration tests: the real handlers against the emulator, which the tests
#     start themselves (or DYNAMODB_ENDPOINT, when set), and the push pipeline through the local
#     WebSocket gateway
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash infra/setup.sh
export PATH="$repo/.venv/bin:$PATH"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
python -m unittest infra/test_moto_server.py infra/test_template.py infra/test_check_deps.py 2>&1 | tee "$log"
cargo test --workspace --lib --bins --tests 2>&1 | tee -a "$log"

# One closing line for all runners (every failure above has already stopped the script).
awk '/^Ran [0-9]+ tests?/ { n += $2 }
     /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) n += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "total: %d passed, %d failed\n", n, f }' "$log"
