# costlab: `make run` starts everything, `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
DEPS   := pyproject.toml constraints.txt

.PHONY: run test test-fast lint install install-dev migrate seed clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit("costlab needs Python >= 3.11, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Bytecode is written by make's processes even where the environment sets PYTHONDONTWRITEBYTECODE:
# a module is compiled once, by the first process that imports it, not by every process again.
# The install imports what nearly every process imports (torch, transformers, Django, Celery, the
# test tools) in two processes at once, about 4,000 modules; a package not installed is passed
# over. Compiling the whole venv instead (compileall -j 0: 17,700 modules, most of transformers'
# models and of sympy never imported) took 94 CPU-s, 52 s (AMD EPYC, 2
# cores, bf16 emulated (slow)).
export PYTHONDONTWRITEBYTECODE :=
IMPORT = $(BIN)/python -c 'exec("import importlib, sys\nfor m in sys.argv[1:]:\n try: importlib.import_module(m)\n except Exception: pass")'
COMPILE = { $(IMPORT) torch torch.distributed.run transformers.models.gpt2.modeling_gpt2 peft lightning & \
  $(IMPORT) django.db.models django.test rest_framework celery celery.bin.worker psycopg numpy optuna \
    plotly httpx pydantic pytest xdist pytest_django schemathesis hypothesis playwright.sync_api \
    faker & wait; } > /dev/null 2>&1 || true
$(VENV)/.installed: $(BIN)/python $(DEPS)
	$(PIP) install -q --no-compile -c constraints.txt -e .
	@$(COMPILE)
	@touch $@

$(VENV)/.installed-dev: $(BIN)/python $(DEPS)
	$(PIP) install -q --no-compile -c constraints.txt -e '.[dev]'
	@$(COMPILE)
	@touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

migrate: install
	$(BIN)/python manage.py migrate --noinput

seed: migrate
	$(BIN)/python manage.py seed_demo

## Start web, the Celery workers and beat, supervised, on the embedded default (or DATABASE_URL / REDIS_URL).
run: migrate
	@bash platform/run-local.sh --submit-runs 6

## The whole suite, in parallel (pytest-xdist: a test database, Redis db and var dir per worker).
## Postgres/Redis when reachable, else SQLite (service tests skip; CI=true fails instead).
## TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)
test: install-dev
	$(BIN)/python -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)

## The edit loop: everything that starts no process (-m "not slow"), on the test databases kept
## from the last run (--reuse-db: new migrations still apply; PYTEST_ARGS=--create-db rebuilds).
test-fast: install-dev
	$(BIN)/python -m pytest $(XDIST) -m "not slow" --reuse-db $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf var .pytest_cache .ruff_cache
