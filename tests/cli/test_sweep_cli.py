"""`costlab sweep start|status|frontier|cancel` against a live server
(probes trained in this process)."""

from __future__ import annotations

import json

import pytest

from apps.sweeps.models import Probe
from tests.cli.conftest import CONTROL, cli
from tests.factories import PricingTableFactory
from workers.sweeps import probe_execute

pytestmark = pytest.mark.slow


def test_sweep_start_status_frontier(lab, capsys, tmp_path):
    PricingTableFactory(tenant=lab["experiment"].tenant)
    base = tmp_path / "base.yaml"
    base.write_text(CONTROL)
    space = tmp_path / "space.json"
    space.write_text('{"model.seq_len": [16, 32]}')
    code, out, err = cli(
        capsys,
        "sweep",
        "start",
        "--name",
        "cheaper",
        "--strategy",
        str(base),
        "--space",
        str(space),
        "--probes",
        "2",
        "--steps",
        "3",
        "--parallel",
        "1",
    )
    assert code == 0, err
    assert out.startswith("sweep ") and "grid over 1 keys, 2 probes of 3 steps on queue cpu" in out
    sweep_id = out.split()[1]
    while Probe.objects.filter(sweep_id=sweep_id, status="queued").exists():
        probe_execute(Probe.objects.get(sweep_id=sweep_id, status="queued").pk)
    code, out, _ = cli(capsys, "sweep", "status", sweep_id)
    assert code == 0 and "completed, 2/2 probes landed" in out and "on the frontier" in out
    code, out, _ = cli(capsys, "sweep", "frontier", sweep_id)
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["#", "seq_len", "step", "s", "peak"] and len(lines) == 4
    assert "✓" in out and "est." in out
    code, out, _ = cli(capsys, "sweep", "frontier", sweep_id, "--json")
    assert {p["params"]["model.seq_len"] for p in json.loads(out)} == {16, 32}
    code, _, err = cli(capsys, "sweep", "cancel", sweep_id)
    assert code == 2 and "only a running sweep cancels" in err
    code, _, err = cli(
        capsys,
        "sweep",
        "start",
        "--name",
        "y",
        "--strategy",
        str(base),
        "--space",
        "{nope",
        "--probes",
        "2",
    )
    assert code == 2 and "--space: not JSON" in err


def test_sweep_start_refuses_a_bad_space_naming_the_key(lab, capsys, tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(CONTROL)
    code, _, err = cli(
        capsys,
        "sweep",
        "start",
        "--name",
        "x",
        "--strategy",
        str(base),
        "--space",
        '{"model.seq_len": {"low": 64, "high": 8}}',
        "--probes",
        "2",
    )
    assert code == 2 and "space.model.seq_len" in err and "inverted" in err
