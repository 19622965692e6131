#!/usr/bin/env bash
# Starts web, the Celery workers and beat together; Ctrl-C stops them all.
# Two worker processes: training (cpu, gpu queues) must never hold up the 30-second
# attribution tick, alerts and the lost-run sweeper (default queue).
# Used by `make run` after migrate + seed. Configuration comes from the environment
# (DATABASE_URL, REDIS_URL, COSTLAB_HOST, COSTLAB_PORT); with none, SQLite + filesystem broker.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=.venv/bin
HOST=${COSTLAB_HOST:-127.0.0.1}
PORT=${COSTLAB_PORT:-8000}
VAR=${COSTLAB_VAR_DIR:-var}
mkdir -p "$VAR"
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-config.settings.local}

pids=()
stop_all() {
  trap - INT TERM
  echo "costlab: stopping web, workers and beat..."
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq 1 100); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
  echo "costlab: stopped."
}
trap 'stop_all; exit 0' INT TERM

"$BIN/python" manage.py runserver --noreload "$HOST:$PORT" &
pids+=($!)
"$BIN/celery" -A config.celery_app worker -Q cpu,gpu --concurrency 1 \
  --hostname "train@%h" --loglevel INFO &
pids+=($!)
"$BIN/celery" -A config.celery_app worker -Q default --concurrency 1 \
  --hostname "platform@%h" --loglevel INFO &
pids+=($!)
"$BIN/celery" -A config.celery_app beat --loglevel INFO --pidfile "$VAR/celerybeat.pid" &
pids+=($!)

echo "costlab is up: http://$HOST:$PORT/ (admin: http://$HOST:$PORT/admin/, health: http://$HOST:$PORT/healthz; Ctrl-C stops them all)"
# If any of them exits on its own, stop the others too: half a platform is worse than none.
wait -n
status=$?
echo "costlab: a process exited (status $status); stopping the rest." >&2
stop_all
exit "$status"
