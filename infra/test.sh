#!/usr/bin/env bash
# Runs all tests. Installs what they need first (infra/setup.sh: the pinned emulator, cfn-lint,
# aws-sam-cli, schemathesis; infra/setup-dynamodb-local.sh: Amazon DynamoDB Local, which needs
# Java 17+; infra/setup-clients.sh: the SDK's build and test tools; Chromium for the browser test).
# DynamoDB is DynamoDB Local unless CHAT_DYNAMODB=moto (our moto launcher) or DYNAMODB_ENDPOINT is
# set; Kinesis is always our moto launcher (infra/local_aws.py starts both).
#   - the emulator launcher's own checks, template.yaml (one source of truth with the local
#     router, cfn-lint, sam validate --lint), unused dependencies
#   - Rust unit and integration tests: the real handlers against DynamoDB and Kinesis, which the
#     tests start themselves (tests/src/server.rs), and the push pipeline through the local
#     WebSocket gateway
#   - the TypeScript SDK's unit and property tests
#   - then, against the whole local stack (infra/run-local.sh on ports of its own): the SDK's
#     integration tests, the demo page in headless Chromium, and the OpenAPI fuzz test
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=infra/wait.sh
source infra/wait.sh
bash infra/setup.sh
if [[ -z "${DYNAMODB_ENDPOINT:-}" && "${CHAT_DYNAMODB:-local}" == local ]]; then
  bash infra/setup-dynamodb-local.sh
fi
bash infra/setup-clients.sh
export PATH="$repo/.venv/bin:$PATH"

log="$(mktemp)"
stack_pid=""
stop_stack() {
  if [[ -n "$stack_pid" ]]; then
    # TERM: a background job of a script ignores INT.
    kill -TERM "$stack_pid" 2>/dev/null || true
    wait "$stack_pid" 2>/dev/null || true
    stack_pid=""
  fi
}
trap 'stop_stack; rm -f "$log"' EXIT

python -m unittest infra/test_moto_server.py infra/test_template.py infra/test_check_deps.py 2>&1 | tee "$log"
# Every AWS call the functions make in the tests is recorded (crates/store/src/iam_log.rs) and checked
# against their policies in template.yaml (infra/test_iam.py): IAM is not enforced locally.
export CHAT_IAM_LOG="$repo/.local/iam-calls"
rm -rf "$CHAT_IAM_LOG"
cargo test --workspace --lib --bins --tests 2>&1 | tee -a "$log"
python -m unittest infra/test_iam.py 2>&1 | tee -a "$log"
unset CHAT_IAM_LOG
(cd clients/js && npm test) 2>&1 | tee -a "$log"

# The whole system, as a user runs it, on ports that do not clash with a stack already running.
export CHAT_REST_PORT=9300 CHAT_WS_PORT=9301 CHAT_MANAGEMENT_PORT=9302 CHAT_DEMO_PORT=9303 CHAT_PUSH_SINK_PORT=9305
export CHAT_FUNCTIONS_PORT=9310 CHAT_EMULATOR_PORT=4800 CHAT_DYNAMODB_PORT=8800 CHAT_STRICT_PORT=8801 CHAT_S3_GATE_PORT=9304 CHAT_FUNCTIONS_RELOAD=0
# No per-user rate limits here: the SDK's integration tests send bursts of 100 from one user
# (the limits themselves: tests/tests/api/limits.rs; docs/api.md §24).
export CHAT_SEND_RATE=0 CHAT_REQUEST_RATE=0
stack_log="$repo/.local/test-stack.log"
mkdir -p "$repo/.local"
bash infra/run-local.sh >"$stack_log" 2>&1 &
stack_pid=$!
wait_for_line "$stack_log" "^Chat backend running locally" "$stack_pid" 600 0.5 "test.sh: the local stack"

export CHAT_API_URL="http://127.0.0.1:$CHAT_REST_PORT" CHAT_WS_URL="ws://127.0.0.1:$CHAT_WS_PORT"
export CHAT_DEMO_URL="http://127.0.0.1:$CHAT_DEMO_PORT/"
(cd clients/js && npm run test:integration) 2>&1 | tee -a "$log"
(cd clients/js && npm run test:browser) 2>&1 | tee -a "$log"
python infra/fuzz_api.py --url "$CHAT_API_URL" 2>&1 | tee -a "$log"
stop_stack

# One closing line for all runners (every failure above has already stopped the script).
awk '/^Ran [0-9]+ tests?/ { n += $2 }
     /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) n += $i; if ($(i+1) ~ /^failed/) f += $i } }
     /^# pass [0-9]+/ { n += $3 }
     /^# fail [0-9]+/ { f += $3 }
     /^fuzz_api: .* requests/ { fuzz = $0 }
     END { printf "total: %d passed, %d failed\n", n, f; if (fuzz != "") print fuzz }' "$log"
