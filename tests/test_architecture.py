"""Layers that point one way: config -> apps -> core, workers -> apps,
gpu_runtime and the CLI alone.

The contracts live in pyproject.toml ([tool.importlinter]) and are checked by import-linter over the
real import graph: an import cycle between two apps, core importing a domain app, an app importing
config, Django in gpu_runtime or in the CLI each fail this test, naming the imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout and "KEPT" in result.stdout


def test_models_import_no_services():
    """Models hold data: a model module importing a services or selectors module (even lazily,
    inside a method) is how the six-module loop through experiments and telemetry began."""
    offenders = []
    for path in sorted((ROOT / "apps").glob("*/models.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[-1] in ("services", "selectors")
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert not offenders, offenders


def test_platform_holds_no_python():
    """A `platform` package would shadow the standard library's module
    (and break uuid, then Django)."""
    assert not list((ROOT / "platform").rglob("*.py"))
