#!/usr/bin/env bash
# `make run` after migrate: the supervised local stack (apps/demo/management/commands/run_local.py).
# Without REDIS_URL it first starts the embedded Redis under $COSTLAB_VAR_DIR (var/); then it seeds
# the demo and starts web, the workers and beat. A process that dies is restarted with backoff and
# the others keep running; Ctrl-C stops everything. Arguments go to run_local (e.g. --submit-runs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-config.settings.local}
exec .venv/bin/python manage.py run_local "$@"
