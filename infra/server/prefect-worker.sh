#!/usr/bin/env bash
# Start the process worker of a work pool in the background, or stop it without stranding a run
# and without letting it take a new one.
#
# Why a stop step of its own: a Prefect 3.8 process worker that gets SIGTERM (or Ctrl-C) while a
# flow run is in progress finishes that run and then keeps dequeuing: it takes the next scheduled
# or automation-started run and runs it too (seen on a real server: a worker that got SIGTERM
# during a corpus build then started the embed and evaluate runs the build's event triggered).
# `stop` therefore
#   1. pauses the work pool (no run is handed out to any worker; runs scheduled meanwhile wait),
#   2. waits until no run of the pool is PENDING, RUNNING or CANCELLING, at most
#      FUNNELRAG_WORKER_STOP_WAIT seconds (default 3600), then cancels the runs still going
#      (`prefect flow-run cancel`) and waits FUNNELRAG_WORKER_CANCEL_WAIT seconds (default 120) for them,
#   3. stops the worker (SIGTERM, SIGKILL after 30 s),
#   4. resumes the pool, unless it was paused before `stop` began.
# Runs left in CANCELLING by a worker killed earlier are listed with the commands that clear them
# (docs/deploying.md, "Stop a worker cleanly").
#
# Usage (with PREFECT_API_URL and PREFECT_HOME exported, e.g. from funnelrag.env):
#   infra/server/prefect-worker.sh start [pool]   background worker; pid in $PREFECT_HOME/funnelrag-worker.pid,
#                                                 log in $PREFECT_HOME/worker.log
#   infra/server/prefect-worker.sh stop [pool] [pid]   pid defaults to the pid file
set -euo pipefail
ACTION="${1:-}"
POOL="${2:-funnelrag-process}"
export PREFECT_HOME="${PREFECT_HOME:-$HOME/.prefect}"
API="${PREFECT_API_URL:?prefect-worker.sh: export PREFECT_API_URL (the server the worker polls)}"
PIDFILE="$PREFECT_HOME/funnelrag-worker.pid"
STOP_WAIT="${FUNNELRAG_WORKER_STOP_WAIT:-3600}"
CANCEL_WAIT="${FUNNELRAG_WORKER_CANCEL_WAIT:-120}"
ACTIVE='["PENDING", "RUNNING", "CANCELLING"]'

say() { echo "prefect-worker.sh: $*"; }
fail() { echo "prefect-worker.sh: $*" >&2; exit 1; }

# POST a JSON body to the API, print the response (curl retries while a busy server answers 503).
post() { curl -fsS --retry 5 --retry-delay 2 --max-time 30 -H 'Content-Type: application/json' -d "$2" "$API$1"; }

runs_filter() {   # the pool's flow runs in the given state types
  printf '{"flow_runs": {"state": {"type": {"any_": %s}}}, "work_pools": {"name": {"any_": ["%s"]}}}' "$1" "$POOL"
}

active_ids() {   # ids of the pool's runs that are not final, one a line
  post /flow_runs/filter "$(runs_filter "$ACTIVE")" \
    | python -c 'import json, sys; [print(r["id"], r["name"], r["state_type"]) for r in json.load(sys.stdin)]'
}

pool_paused() {
  curl -fsS --retry 5 --retry-delay 2 --max-time 30 "$API/work_pools/$POOL" \
    | python -c 'import json, sys; sys.exit(0 if json.load(sys.stdin).get("is_paused") else 1)'
}

wait_idle() {   # wait up to $1 s until the pool has no active run; returns 1 on timeout
  local deadline=$(( $(date +%s) + $1 ))
  while [ -n "$(active_ids)" ]; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 5
  done
}

case "$ACTION" in
  start)
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      fail "a worker is already running (pid $(cat "$PIDFILE"), $PIDFILE); stop it first"
    fi
    mkdir -p "$PREFECT_HOME"
    nohup prefect worker start --pool "$POOL" >>"$PREFECT_HOME/worker.log" 2>&1 &
    echo $! >"$PIDFILE"
    say "worker of pool $POOL started (pid $!, log $PREFECT_HOME/worker.log)"
    ;;
  stop)
    PID="${3:-}"
    if [ -z "$PID" ]; then
      [ -f "$PIDFILE" ] || fail "no pid given and no $PIDFILE (was the worker started with 'start'?)"
      PID="$(cat "$PIDFILE")"
    fi
    kill -0 "$PID" 2>/dev/null || say "worker pid $PID is not running; only the pool's runs are checked"
    was_paused=""
    if pool_paused; then was_paused=1; else prefect work-pool pause "$POOL" >/dev/null; fi
    say "pool $POOL paused: no new run is handed out"
    if ! wait_idle "$STOP_WAIT"; then
      say "runs still going after $STOP_WAIT s; cancelling them:"
      active_ids | while read -r id name state; do
        say "  cancel $name ($id, $state)"
        prefect flow-run cancel "$id" >/dev/null || true
      done
      wait_idle "$CANCEL_WAIT" || true
    fi
    if kill -0 "$PID" 2>/dev/null; then
      kill -TERM "$PID"
      for _ in $(seq 30); do kill -0 "$PID" 2>/dev/null || break; sleep 1; done
      if kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID"; say "worker $PID did not exit on SIGTERM: killed"; fi
    fi
    [ -f "$PIDFILE" ] && [ "$(cat "$PIDFILE")" = "$PID" ] && rm -f "$PIDFILE"
    say "worker $PID stopped"
    left="$(active_ids)"
    if [ -n "$left" ]; then
      say "runs of pool $POOL that are still not final (clear them: docs/deploying.md, 'Stop a worker cleanly'):"
      echo "$left" | sed 's/^/  /'
    fi
    if [ -z "$was_paused" ]; then prefect work-pool resume "$POOL" >/dev/null; say "pool $POOL resumed"; fi
    ;;
  *)
    fail "usage: prefect-worker.sh start|stop [pool] [pid]"
    ;;
esac
