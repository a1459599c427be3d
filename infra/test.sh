#!/usr/bin/env bash
# Runs all tests. Installs what they need first (infra/setup.sh): the pinned emulator, cfn-lint.
#   - the emulator launcher's own checks (infra/test_moto_server.py)
#   - template.yaml: one source of truth with the cargo-lambda router, cfn-lint (infra/test_template.py)
#   - Rust unit and integration tests: the real handlers against the emulator, which the tests
#     start themselves (or DYNAMODB_ENDPOINT, when set)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash infra/setup.sh
export PATH="$repo/.venv/bin:$PATH"

python -m unittest infra/test_moto_server.py infra/test_template.py
cargo test --workspace
