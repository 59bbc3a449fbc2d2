#!/usr/bin/env bash
# Start a local Prefect API + UI (SQLite in $PREFECT_HOME) and a process work pool with a worker.
# Usage: infra/server/prefect-server.sh [pool-name]
set -euo pipefail
POOL="${1:-funnelrag-process}"
export PREFECT_HOME="${PREFECT_HOME:-$HOME/.prefect}"
HOST="${PREFECT_SERVER_API_HOST:-127.0.0.1}"
PORT="${PREFECT_SERVER_API_PORT:-4200}"
prefect server start --host "$HOST" --port "$PORT" --background
export PREFECT_API_URL="http://$HOST:$PORT/api"
prefect config set PREFECT_API_URL="$PREFECT_API_URL" >/dev/null
for _ in $(seq 60); do curl -fsS "$PREFECT_API_URL/health" >/dev/null 2>&1 && break; sleep 1; done
prefect work-pool create "$POOL" --type process --overwrite
# one flow run at a time on this pool (the deployments also set concurrency_limit: 1)
prefect work-pool set-concurrency-limit "$POOL" 1
echo "Prefect API at $PREFECT_API_URL; register deployments with:  prefect deploy --all"
echo "then start a worker:  prefect worker start --pool $POOL"
