"""The costlab CLI end to end against a live server: submit (arm mapping, --wait), status, report,
gate.

Most calls run main() in this process (over real HTTP); one runs the installed console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from apps.experiments import runs
from apps.experiments.models import Arm, Run
from tests.cli.conftest import CANDIDATE, CONTROL, cli, priced_run

pytestmark = pytest.mark.slow


def test_the_cli_imports_neither_django_nor_torch():
    code = (
        "import sys, costlab_cli.main; heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'django', 'torch', 'rest_framework', 'apps', 'gpu_runtime', 'config', 'yaml', "
        "'optuna'}); "
        "print(heavy); "
        "sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_submit_maps_the_strategy_file_onto_an_arm(lab, capsys, strategy, monkeypatch):
    monkeypatch.setenv("CI", "true")  # as CI services set it
    exp = str(lab["experiment"].pk)
    code, out, _ = cli(
        capsys,
        "submit",
        "--experiment",
        exp,
        "--strategy",
        strategy(CANDIDATE),
        "--git-sha",
        "abc1",
        "--tag",
        "nightly",
        "--tag",
        "pr-7",
        "--note",
        "from the pipeline",
    )
    assert code == 0 and "on arm 'candidate' (matched)" in out
    run = Run.objects.get()
    assert run.arm == lab["candidate"] and run.git_sha == "abc1" and run.status == "queued"
    assert run.tags_list == ["nightly", "pr-7"] and run.note == "from the pipeline"
    assert run.priority == "ci"  # under $CI a pipeline's run is taken before batch runs

    code, out, err = cli(
        capsys,
        "submit",
        "--experiment",
        exp,
        "--strategy",
        strategy(CANDIDATE + "# pr 12\n"),
        "--arm",
        "pr-12",
    )
    assert code == 0 and "on arm 'pr-12' (created)" in out, err
    assert Arm.objects.get(name="pr-12").weight == 0

    code, out, _ = cli(
        capsys,
        "submit",
        "--experiment",
        exp,
        "--strategy",
        strategy(CANDIDATE + "# v2\n"),
        "--arm",
        "pr-12",
        "--run-key",
        "gh-99-1",
    )
    assert code == 0 and "(updated revision 2)" in out
    again = cli(
        capsys,
        "submit",
        "--experiment",
        exp,
        "--strategy",
        strategy(CANDIDATE + "# v2\n"),
        "--arm",
        "pr-12",
        "--run-key",
        "gh-99-1",
    )
    assert again[0] == 0 and Run.objects.filter(run_key="gh-99-1").count() == 1  # the same run


def test_submit_external_creates_an_external_run_with_what_it_holds(lab, capsys, strategy):
    exp = str(lab["experiment"].pk)
    code, out, err = cli(
        capsys,
        "submit",
        "--experiment",
        exp,
        "--strategy",
        strategy(CANDIDATE),
        "--external",
        "--vcpus",
        "8",
        "--memory-gb",
        "32",
    )
    assert code == 0 and "(external: send telemetry, then finish)" in out, err
    run = Run.objects.get()
    assert (
        run.kind == "external"
        and run.status == "running"
        and run.vcpus == 8
        and run.memory_gb == 32
    )
    code, _, err = cli(
        capsys, "submit", "--experiment", exp, "--strategy", strategy(CANDIDATE), "--vcpus", "8"
    )
    assert code == 2 and "--vcpus: only for --external runs" in err
    code, _, err = cli(
        capsys,
        "submit",
        "--experiment",
        exp,
        "--strategy",
        strategy(CANDIDATE),
        "--external",
        "--wait",
    )
    assert code == 2 and "--wait: an external run ends when its trainer POSTs /finish/" in err


def test_submit_refusals_exit_2_with_the_reason(lab, capsys, strategy):
    exp = str(lab["experiment"].pk)
    code, _, err = cli(
        capsys,
        "submit",
        "--experiment",
        exp,
        "--strategy",
        strategy(CONTROL + "# edit\n"),
        "--arm",
        "control",
    )
    assert code == 2 and "'control' is the control arm" in err
    code, _, err = cli(
        capsys, "submit", "--experiment", exp, "--strategy", strategy(CONTROL + "# unknown\n")
    )
    assert code == 2 and "no arm of experiment" in err and "--arm NAME" in err
    code, _, err = cli(
        capsys, "submit", "--experiment", exp, "--strategy", strategy("model: [1"), "--arm", "bad"
    )
    assert code == 2 and "HTTP 400: strategy_yaml: <document>: not valid YAML" in err
    code, _, err = cli(capsys, "submit", "--experiment", exp, "--strategy", "/nonexistent.yaml")
    assert code == 2 and "cannot read /nonexistent.yaml" in err
    assert Run.objects.count() == 0


def finish_when_submitted(
    status: str, *, then=None, stop: threading.Event | None = None, wait_s: float = 20
) -> threading.Thread:
    """Play the worker: claim the run once it is queued, then end it with `status`; `then(run)`
    after (what the run should have measured); `stop` ends the wait early."""

    def work():
        try:
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not (stop and stop.is_set()):
                run = Run.objects.filter(status="queued").first()
                if run:
                    runs.run_claim(run_id=run.pk, owner="fake-worker")
                    time.sleep(0.3)
                    runs.run_finish(
                        run_id=run.pk,
                        owner="fake-worker",
                        status=status,
                        error="" if status == "succeeded" else "CUDA error: out of memory",
                    )
                    if then is not None:
                        then(run)
                    return
                time.sleep(0.1)
        finally:
            connection.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(("outcome", "code"), [("succeeded", 0), ("failed", 1)])
def test_submit_wait_exits_by_how_the_run_ended(lab, capsys, strategy, outcome, code):
    worker = finish_when_submitted(outcome)
    got, out, _ = cli(
        capsys,
        "submit",
        "--experiment",
        str(lab["experiment"].pk),
        "--strategy",
        strategy(CONTROL),
        "--wait",
        "--poll",
        "0.2",
        "--timeout",
        "30",
    )
    worker.join(5)
    assert got == code and f": {outcome} · arm 'control'" in out.splitlines()[-1]
    if outcome == "failed":
        assert out.endswith("CUDA error: out of memory")


def test_submit_wait_gives_up_after_the_timeout(lab, capsys, strategy):
    code, _, err = cli(
        capsys,
        "submit",
        "--experiment",
        str(lab["experiment"].pk),
        "--strategy",
        strategy(CONTROL),
        "--wait",
        "--poll",
        "0.1",
        "--timeout",
        "0.3",
    )
    assert code == 2 and "still queued after 0.3 s" in err


def test_status_and_report_in_every_format(lab, capsys):
    priced_run(lab["control"], "1.00")
    run = priced_run(lab["candidate"], "1.02")
    code, out, _ = cli(capsys, "status", str(run.pk))
    assert (
        code == 0
        and out
        == f"run {run.pk}: succeeded · arm 'candidate' · 50 steps · 1,000,000 tokens · 1.020000 USD"
    )
    assert json.loads(cli(capsys, "status", str(run.pk), "--json")[1])["id"] == run.pk
    missing = cli(capsys, "status", "999999")
    assert missing[0] == 2 and "HTTP 404" in missing[2]

    exp = str(lab["experiment"].pk)
    code, table, _ = cli(capsys, "report", exp)
    # one run each: +2 % is measured, but no bound shows it within the threshold
    assert code == 0 and "candidate" in table and "+2.0%" in table and "inconclusive" in table
    code, markdown, _ = cli(capsys, "report", exp, "--format", "markdown")
    assert code == 0 and "| control (control) |" in markdown and "|---|---|---:|" in markdown
    code, raw, _ = cli(capsys, "report", exp, "--format", "json")
    arms = {a["name"]: a for a in json.loads(raw)["arms"]}
    assert arms["candidate"]["deviation"] == pytest.approx(0.02)


def test_gate_exit_codes_each_with_a_one_line_reason(lab, capsys):
    exp = str(lab["experiment"].pk)
    code, _, err = cli(capsys, "gate", exp, "--max-regression", "5%")
    assert (
        code == 2
        and "control arm 'control' has no priced runs" in err
        and len(err.splitlines()) == 1
    )
    priced_run(lab["control"], "1.00")
    code, _, err = cli(capsys, "gate", exp, "--max-regression", "5%")
    assert code == 2 and "no candidate arm with priced runs" in err

    run = priced_run(lab["candidate"], "1.03")
    code, out, _ = cli(capsys, "gate", exp, "--max-regression", "5%")
    assert code == 0 and out.startswith(
        "PASS: arm 'candidate' costs +3.00% USD/1M tokens vs control 'control'"
    )
    # One line per check: cost, then quality (never silent, not gated without the flag).
    assert out.splitlines()[1:] == [
        "quality (not gated): arm 'candidate' held-out loss not measured "
        "(no attribution window has compared it yet)"
    ]
    code, out, _ = cli(capsys, "gate", exp, "--max-regression", "0.02")
    assert (
        code == 1
        and out.startswith("REGRESSION: arm 'candidate' costs +3.00%")
        and "limit +2.00%" in out
    )
    code, out, _ = cli(capsys, "gate", exp, "--max-regression", "2%", "--run", str(run.pk))
    assert code == 1 and out.startswith(f"REGRESSION: run {run.pk} (arm 'candidate') costs +3.00%")

    for argv, reason in [
        (["--max-regression", "5"], "ambiguous; write 5%"),
        (["--max-regression", "5%", "--arm", "nope"], "no candidate arm named 'nope'"),
    ]:
        code, _, err = cli(capsys, "gate", exp, *argv)
        assert code == 2 and reason in err


def test_report_and_gate_show_and_compare_gco2e(lab, capsys):
    """Issue 24, item 7: the CLI's report shows gCO2e beside USD, and --metric gco2e compares
    and gates on it."""
    exp = str(lab["experiment"].pk)

    def run(arm, grams: float, joules: float):
        return priced_run(
            lab[arm],
            "1.00",
            energy_j=joules,
            cost_breakdown={"carbon_g": grams, "carbon_unpriced_s": 0.0},
        )

    run("control", 100.0, 1.0e6)
    candidate = run("candidate", 110.0, 1.1e6)  # the same dollars, 10 % more carbon
    code, table, _ = cli(capsys, "report", exp)
    assert code == 0 and "gCO2e/1M tok" in table and "110.0 ±10%" in table  # rapl: CPU runs
    assert "+0.0%" in table  # compared on USD
    code, table, _ = cli(capsys, "report", exp, "--metric", "gco2e")
    assert code == 0 and "vs control on gCO2e" in table and "+10.0%" in table
    code, out, _ = cli(capsys, "gate", exp, "--max-regression", "5%")
    assert code == 0, out
    code, out, _ = cli(capsys, "gate", exp, "--max-regression", "5%", "--metric", "gco2e")
    assert code == 1 and out.startswith(
        "REGRESSION: arm 'candidate' emits +10.00% gCO2e/1M tokens vs control 'control'"
    ), out
    code, out, _ = cli(
        capsys,
        "gate",
        exp,
        "--max-regression",
        "5%",
        "--metric",
        "gco2e",
        "--run",
        str(candidate.pk),
    )
    assert code == 1 and "emits +10.00%" in out


def test_credentials_and_reachability_errors_exit_2(lab, capsys, monkeypatch):
    exp = str(lab["experiment"].pk)
    monkeypatch.setenv("COSTLAB_TOKEN", "clb_wrong")
    code, _, err = cli(capsys, "gate", exp, "--max-regression", "5%")
    assert code == 2 and "HTTP 401: invalid token" in err
    monkeypatch.delenv("COSTLAB_TOKEN")
    code, _, err = cli(capsys, "report", exp)
    assert code == 2 and "COSTLAB_TOKEN is not set" in err
    monkeypatch.setenv("COSTLAB_TOKEN", lab["token"])
    monkeypatch.setenv("COSTLAB_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    naps = []
    monkeypatch.setattr("costlab_cli.client.time.sleep", naps.append)
    code, _, err = cli(capsys, "report", exp)
    assert (
        code == 2 and "cannot reach" in err and len(naps) == 3
    )  # retried with backoff, then gave up


def test_the_console_script_exits_with_the_gate_verdict(lab):
    priced_run(lab["control"], "1.00")
    priced_run(lab["candidate"], "1.20")
    script = Path(sys.executable).with_name("costlab")
    assert script.exists(), "pip install -e . creates the costlab console script"
    # The script of the installed package, running this checkout's code
    # (the venv may serve several).
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [str(script), "gate", str(lab["experiment"].pk), "--max-regression", "5%"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 1 and result.stdout.startswith(
        "REGRESSION: arm 'candidate' costs +20.00%"
    )
