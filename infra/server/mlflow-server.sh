#!/usr/bin/env bash
# Start an MLflow tracking + registry server over the same SQLite file the CLI uses by default,
# sized for a 2-core machine: one gunicorn worker and no job consumers (MLflow's defaults, 4
# workers + 7 job consumers, take ~1.8 GB and compete with the flows for the CPU).
# Usage: infra/server/mlflow-server.sh [funnelrag-home]   (then: export MLFLOW_TRACKING_URI=http://127.0.0.1:5000, as the Deploying environment file does)
set -euo pipefail
HOME_DIR="$(cd "${1:-${FUNNELRAG_HOME:-funnelrag-home}}" && pwd)"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
exec mlflow server --host "${MLFLOW_HOST:-127.0.0.1}" --port "${MLFLOW_PORT:-5000}" \
  --workers "${MLFLOW_WORKERS:-1}" \
  --backend-store-uri "sqlite:///$HOME_DIR/mlflow.db" \
  --artifacts-destination "$HOME_DIR/mlruns"
