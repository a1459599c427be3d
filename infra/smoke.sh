#!/usr/bin/env bash
# Smoke test of a deployed stack after `sam deploy`, or of the local one (README "Deploy", step 5):
#   infra/smoke.sh STACK_NAME            (AWS CLI v2 and credentials; tokens: see --help)
#   infra/smoke.sh --local [REST_URL WS_URL]
# PASS/FAIL per step; exits non-zero when any step failed. All of it is in infra/smoke.py.
set -euo pipefail
exec python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/smoke.py" "$@"
