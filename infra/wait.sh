# Sourced by infra/run-local.sh and infra/test.sh.

# wait_for_line LOG PATTERN PID TRIES INTERVAL WHAT: waits until LOG has a line matching PATTERN,
# checking TRIES times every INTERVAL seconds; exits with LOG shown if PID ends first ("WHAT failed
# to start") or the line never comes ("WHAT did not start in time").
wait_for_line() {
  local log="$1" pattern="$2" pid="$3" tries="$4" interval="$5" what="$6"
  for _ in $(seq 1 "$tries"); do
    grep -q "$pattern" "$log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "$what failed to start" >&2; exit 1; }
    sleep "$interval"
  done
  grep -q "$pattern" "$log" || { cat "$log"; echo "$what did not start in time" >&2; exit 1; }
}
