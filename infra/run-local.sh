#!/usr/bin/env bash
# Runs the whole system locally (README "Set-up"), in the foreground; Ctrl-C stops everything it started.
#   REST API        http://127.0.0.1:9000  (the local HTTP API stand-in, in front of cargo lambda watch
#                   on :9010 running the functions with concurrent instances)
#   WebSocket API   ws://127.0.0.1:9001/?token=...   (+ Management API on :9002)
#   demo chat page  http://127.0.0.1:9003/ (clients/demo on the TypeScript SDK)
#   push sink       http://127.0.0.1:9004/notifications?token=... (what offline notifications sent)
#   DynamoDB + DynamoDB Streams: Amazon DynamoDB Local on :8000 (infra/setup-dynamodb-local.sh
#                   installs it; Java 17+), or our moto launcher with CHAT_DYNAMODB=moto, or
#                   DYNAMODB_ENDPOINT if set; Kinesis (+ SQS): our moto launcher on :4566
#                   (both started by infra/local_aws.py); in front of DynamoDB Local, the
#                   strictness layer on :8001 (infra/dynamodb-strict), which the functions use
#   stream -> relay -> Kinesis -> fanout pollers (the same handler code as in AWS)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=infra/wait.sh
source infra/wait.sh

REST_PORT="${CHAT_REST_PORT:-9000}"
FUNCTIONS_PORT="${CHAT_FUNCTIONS_PORT:-9010}"
# Instances per function; the REST edge keeps at most this many requests of a route in flight.
export CHAT_FUNCTIONS_CONCURRENCY="${CHAT_FUNCTIONS_CONCURRENCY:-32}"
DEMO_PORT="${CHAT_DEMO_PORT:-9003}"
# Offline notifications (docs/api.md §33): the push sink stands in for SNS; 2 s delay locally.
export CHAT_PUSH_SINK_PORT="${CHAT_PUSH_SINK_PORT:-9004}" NOTIFY_DELAY_SECONDS="${NOTIFY_DELAY_SECONDS:-2}"
# The all-requests limit exact (docs/api.md §24): deployed, one request in 16 writes the bucket.
export CHAT_REQUEST_SAMPLE="${CHAT_REQUEST_SAMPLE:-1}"
WS_PORT="${CHAT_WS_PORT:-9001}"
MANAGEMENT_PORT="${CHAT_MANAGEMENT_PORT:-9002}"
EMULATOR_PORT="${CHAT_EMULATOR_PORT:-4566}"
DYNAMODB_PORT="${CHAT_DYNAMODB_PORT:-8000}"
STRICT_PORT="${CHAT_STRICT_PORT:-8001}"
S3_GATE_PORT="${CHAT_S3_GATE_PORT:-9005}"
DYNAMODB_BACKEND="${CHAT_DYNAMODB:-local}"

bash infra/setup.sh
if [[ -z "${DYNAMODB_ENDPOINT:-}" && "$DYNAMODB_BACKEND" == local ]]; then
  # Installs DynamoDB Local on first use; says what to do without Java 17+.
  bash infra/setup-dynamodb-local.sh
fi
export PATH="$repo/.venv/bin:$PATH"

pids=()
# cargo lambda watch runs each function as a child process: stop whole trees.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "run-local: stopping"
  for pid in "${pids[@]}"; do kill_tree "$pid"; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

# DynamoDB (DynamoDB Local, moto, or DYNAMODB_ENDPOINT) and Kinesis (moto: DynamoDB Local has
# none), with template.yaml's tables, stream and queues. It prints READY <dynamodb> <kinesis>.
log="$repo/.local/local-aws-$EMULATOR_PORT.log"
mkdir -p "$repo/.local"
python infra/local_aws.py --dynamodb "$DYNAMODB_BACKEND" --dynamodb-endpoint "${DYNAMODB_ENDPOINT:-}" \
  --port "$EMULATOR_PORT" --dynamodb-port "$DYNAMODB_PORT" --template template.yaml >"$log" 2>&1 &
pids+=($!)
wait_for_line "$log" '^READY' "${pids[-1]}" 240 0.25 "run-local: DynamoDB/Kinesis"
read -r _ dynamodb kinesis < <(grep -m1 '^READY' "$log")
if [[ -n "${DYNAMODB_ENDPOINT:-}" ]]; then
  dynamodb_what="DYNAMODB_ENDPOINT"
  echo "run-local: using DYNAMODB_ENDPOINT=$DYNAMODB_ENDPOINT"
elif [[ "$DYNAMODB_BACKEND" == moto ]]; then
  dynamodb_what="our moto launcher, CHAT_DYNAMODB=moto"
else
  dynamodb_what="Amazon DynamoDB Local"
fi
export KINESIS_ENDPOINT="${KINESIS_ENDPOINT:-$kinesis}"
export CHAT_AUTH_MODE=local
export CHAT_LOCAL_JWT_SECRET="${CHAT_LOCAL_JWT_SECRET:-local-dev-secret}"
export CHAT_TABLE="${CHAT_TABLE:-ChatTable}" CONNECTIONS_TABLE="${CONNECTIONS_TABLE:-ConnectionsTable}"
export EVENT_STREAM="${EVENT_STREAM:-EventStream}"
export WS_MANAGEMENT_ENDPOINT="http://127.0.0.1:$MANAGEMENT_PORT"
export CHAT_WS_PORT="$WS_PORT" CHAT_MANAGEMENT_PORT="$MANAGEMENT_PORT"
# The archive tier on moto's S3 (the bucket created from template.yaml under its logical id in
# lower case). CHAT_ARCHIVE_AFTER_SECONDS=20 archives messages older than 20 s (5-second work-list
# buckets) and runs the archiver every 5 s; without it, the template's 90 days, checked every 5 min.
export CHAT_ARCHIVE_BUCKET="${CHAT_ARCHIVE_BUCKET:-archivebucket}" S3_ENDPOINT="${S3_ENDPOINT:-$kinesis}"
archive_every=300
[[ -n "${CHAT_ARCHIVE_AFTER_SECONDS:-}" ]] && archive_every=5

# The demo page and the SDK it runs on (clients/js builds both).
bash infra/setup-clients.sh
export CHAT_DEMO_DIR="$repo/clients/demo/dist" CHAT_DEMO_PORT="$DEMO_PORT"

# Build once up front so the first request does not wait for a compile.
echo "run-local: building (the first build takes a few minutes)"
cargo build --workspace --bins --quiet
bin="${CARGO_TARGET_DIR:-$repo/target}/debug"

# What DynamoDB Local and moto lack (transaction conflicts, per-partition throttling; latency
# and faults when asked for), in front of them: infra/dynamodb-strict, on by default
# (CHAT_STRICT=off, or CHAT_STRICT_* per part). moto, which answers one request at a time, gets
# the conflicts only, unless CHAT_STRICT_THROUGHPUT=on.
strict_what=""
if [[ "$DYNAMODB_BACKEND" == moto && -z "${CHAT_STRICT_THROUGHPUT:-}" ]]; then
  export CHAT_STRICT_THROUGHPUT=off
fi
if [[ "${CHAT_STRICT:-on}" != off ]]; then
  strict_log="$repo/.local/dynamodb-strict-$STRICT_PORT.log"
  "$bin/dynamodb-strict" --listen "127.0.0.1:$STRICT_PORT" --dynamodb "$dynamodb" >"$strict_log" 2>&1 &
  pids+=($!)
  wait_for_line "$strict_log" '^READY' "${pids[-1]}" 100 0.1 "run-local: dynamodb-strict"
  strict_what=", behind the strictness layer: control at http://127.0.0.1:$STRICT_PORT/strict/config"
  dynamodb="http://127.0.0.1:$STRICT_PORT"
fi
export DYNAMODB_ENDPOINT="$dynamodb"

# Attachments: browsers and curl upload and download with presigned URLs signed for the S3 gate
# (infra/s3-gate), which checks them as S3 does (moto does not) and forwards to moto's S3. Each
# upload's S3 event goes to the thumbnailer (functions/thumbnails) through cargo lambda watch's
# Invoke API, as the bucket's notification invokes it deployed.
# Malware scanning is on locally unless CHAT_SCAN_UPLOADS=0 (deployed: template ScanUploads,
# default off; docs/api.md §36): the functions scan-gate what they serve, and the gate's stand-in
# for GuardDuty Malware Protection for S3 tags each upload CHAT_SCAN_DELAY_MS after it (0, the
# default: before the upload is answered) and sends GuardDuty's result event to the thumbnailer,
# as the deployed EventBridge rule does.
export CHAT_ATTACHMENTS_BUCKET="${CHAT_ATTACHMENTS_BUCKET:-attachmentsbucket}"
thumbnailer="http://127.0.0.1:$FUNCTIONS_PORT/2015-03-31/functions/thumbnails/invocations"
scan_args=()
export CHAT_SCAN_UPLOADS="${CHAT_SCAN_UPLOADS:-1}"
case "$CHAT_SCAN_UPLOADS" in
  1|true|on) scan_args=(--scan "${CHAT_SCAN_DELAY_MS:-0}" --scan-notify "$thumbnailer") ;;
esac
gate_log="$repo/.local/s3-gate-$S3_GATE_PORT.log"
AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-local}" \
  "$bin/s3-gate" --listen "127.0.0.1:$S3_GATE_PORT" --s3 "$S3_ENDPOINT" \
  --notify "$thumbnailer" "${scan_args[@]}" >"$gate_log" 2>&1 &
pids+=($!)
wait_for_line "$gate_log" '^READY' "${pids[-1]}" 100 0.1 "run-local: s3-gate"
export CHAT_ATTACHMENTS_S3_ENDPOINT="http://127.0.0.1:$S3_GATE_PORT"

# The gateway also serves the REST API on $REST_PORT, in front of the functions.
CHAT_REST_PORT="$REST_PORT" CHAT_REST_UPSTREAM="http://127.0.0.1:$FUNCTIONS_PORT" "$bin/local-gateway" &
pids+=($!)
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$REST_PORT") 2>/dev/null && break
  kill -0 "${pids[-1]}" 2>/dev/null || { echo "run-local: the local gateway failed to start" >&2; exit 1; }
  sleep 0.1
done

# The archiver on its schedule: a loop here, EventBridge in AWS.
CHAT_ARCHIVE_INTERVAL_SECONDS="$archive_every" "$bin/archiver" >"$repo/.local/archiver-$REST_PORT.log" 2>&1 &
pids+=($!)

# Lambda runs concurrent requests in separate instances: --concurrency lets each function serve
# up to 32 requests at once, so races reach the store locally too.
# CHAT_FUNCTIONS_RELOAD=0 (infra/test.sh) turns off reloading on file changes: files the tests
# write would otherwise restart every instance mid-run, and each restart waits for cargo.
reload=()
[[ "${CHAT_FUNCTIONS_RELOAD:-1}" == 0 ]] && reload=(--ignore-changes)
# Run directly (not as `cargo lambda`, which would set CARGO to cargo itself), with a CARGO that
# starts each instance from the binary just built (infra/cargo-for-watch.sh).
CARGO="$repo/infra/cargo-for-watch.sh" CHAT_REAL_CARGO="$(command -v cargo)" CHAT_BIN_DIR="$bin" \
  CARGO_LAMBDA_IGNORE_FILE="$repo/infra/watch-ignore" \
  CHAT_REPO="$repo" cargo-lambda lambda watch -A 127.0.0.1 -P "$FUNCTIONS_PORT" \
  --concurrency "$CHAT_FUNCTIONS_CONCURRENCY" "${reload[@]}" &
pids+=($!)
for _ in $(seq 1 150); do
  (exec 3<>"/dev/tcp/127.0.0.1/$FUNCTIONS_PORT") 2>/dev/null && break
  sleep 0.2
done
# Start every function's instances now rather than during the first client's requests.
python infra/warm_functions.py "http://127.0.0.1:$REST_PORT" --concurrency "$CHAT_FUNCTIONS_CONCURRENCY"

cat <<EOT

Chat backend running locally
  REST API         http://127.0.0.1:$REST_PORT  (functions: cargo lambda watch on :$FUNCTIONS_PORT, $CHAT_FUNCTIONS_CONCURRENCY concurrent requests each)
  WebSocket        ws://127.0.0.1:$WS_PORT/?token=<token>
  Demo chat page   http://127.0.0.1:$DEMO_PORT/
  Push sink        http://127.0.0.1:$CHAT_PUSH_SINK_PORT/notifications?token=<device token>  (notifications, ${NOTIFY_DELAY_SECONDS} s after a message still unread)
  Management API   $WS_MANAGEMENT_ENDPOINT
  DynamoDB         $DYNAMODB_ENDPOINT  ($dynamodb_what$strict_what; tables $CHAT_TABLE, $CONNECTIONS_TABLE)
  Kinesis          $KINESIS_ENDPOINT  (stream $EVENT_STREAM)
  Attachments (S3) $CHAT_ATTACHMENTS_S3_ENDPOINT  (bucket $CHAT_ATTACHMENTS_BUCKET; the S3 gate in front of $S3_ENDPOINT)${scan_args:+; malware scanning on: the EICAR test file is found infected}
  Archive (S3)     $S3_ENDPOINT  (bucket $CHAT_ARCHIVE_BUCKET; messages older than ${CHAT_ARCHIVE_AFTER_SECONDS:-7776000} s move there, checked every $archive_every s)
Mint a token:      TOKEN=\$(python3 infra/mint_token.py u1)
Try:               curl -s http://127.0.0.1:$REST_PORT/inbox -H "Authorization: Bearer \$TOKEN"
Ctrl-C stops everything.
EOT

wait -n "${pids[@]}"
