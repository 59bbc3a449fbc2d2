#!/usr/bin/env bash
# Start a local Prefect API + UI in the background (SQLite in $PREFECT_HOME; analytics off, as
# this machine has no internet) and create the process work pool (one flow run at a time).
# It starts no worker and changes no Prefect profile: it prints the export line and the worker
# command to run. If the API is not healthy within $PREFECT_SERVER_WAIT seconds (default 90), or
# the server exits, it prints the end of the server log and exits 1.
# Usage: infra/server/prefect-server.sh [pool-name]      stop: kill "$(cat "$PREFECT_HOME/funnelrag-server.pid")"
set -euo pipefail
POOL="${1:-funnelrag-process}"
export PREFECT_HOME="${PREFECT_HOME:-$HOME/.prefect}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
HOST="${PREFECT_SERVER_API_HOST:-127.0.0.1}"
PORT="${PREFECT_SERVER_API_PORT:-4200}"
WAIT="${PREFECT_SERVER_WAIT:-90}"
export PREFECT_API_URL="http://$HOST:$PORT/api"
mkdir -p "$PREFECT_HOME"
LOG="$PREFECT_HOME/server.log"

fail() {
  echo "prefect-server.sh: $1 (server log: $LOG)" >&2
  tail -n 25 "$LOG" >&2 || true
  exit 1
}

nohup prefect server start --host "$HOST" --port "$PORT" >"$LOG" 2>&1 &
PID=$!
echo "$PID" >"$PREFECT_HOME/funnelrag-server.pid"   # not server.pid: `prefect server start` refuses to run if that exists
healthy=""
for _ in $(seq "$WAIT"); do
  if curl -fsS --max-time 5 "$PREFECT_API_URL/health" >/dev/null 2>&1; then healthy=1; break; fi
  kill -0 "$PID" 2>/dev/null || fail "the Prefect server exited during start-up"
  sleep 1
done
if [ -z "$healthy" ]; then
  kill "$PID" 2>/dev/null || true
  fail "the Prefect API at $PREFECT_API_URL was not healthy after $WAIT s; stopped it"
fi
prefect work-pool create "$POOL" --type process --overwrite >/dev/null || fail "cannot create work pool $POOL"
prefect work-pool set-concurrency-limit "$POOL" 1 >/dev/null || fail "cannot limit work pool $POOL"
echo "Prefect API at $PREFECT_API_URL (pid $PID, log $LOG); work pool $POOL (concurrency 1)."
echo "In every shell that deploys or runs a worker:"
echo "  export PREFECT_API_URL=$PREFECT_API_URL"
echo "Register the deployments (README \"Deploying\"):  prefect deploy --all"
echo "Start a worker:  infra/server/prefect-worker.sh start $POOL   # in the background; \`... stop\` lets its run finish (foreground: prefect worker start --pool $POOL)"
