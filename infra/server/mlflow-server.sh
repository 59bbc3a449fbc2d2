#!/usr/bin/env bash
# Start an MLflow tracking + registry server over the same SQLite file the CLI uses by default.
# Usage: infra/server/mlflow-server.sh [funnelrag-home]   (then: --set workspace.tracking_uri=http://127.0.0.1:5000)
set -euo pipefail
HOME_DIR="$(cd "${1:-funnelrag-home}" && pwd)"
exec mlflow server --host "${MLFLOW_HOST:-127.0.0.1}" --port "${MLFLOW_PORT:-5000}" \
  --backend-store-uri "sqlite:///$HOME_DIR/mlflow.db" \
  --artifacts-destination "$HOME_DIR/mlruns"
