"""``python -m gpu_runtime``: train writes metrics and a result; SIGTERM leaves both valid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_runtime.cli import EXIT_REFUSED, EXIT_SIGTERM, main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
STRATEGY = """model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 5, global_batch: 4, lr: 3.0e-3, warmup_steps: 2}
telemetry: {interval_s: 0.05}
"""


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_train_writes_metrics_and_prints_the_result(tmp_path, capsys):
    strategy = tmp_path / "strategy.yaml"
    strategy.write_text(STRATEGY)
    metrics = tmp_path / "metrics.jsonl"
    assert main(["train", str(strategy), "--steps", "3", "--out", str(metrics), "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["status"], result["steps"], result["tokens"]) == ("completed", 3, 3 * 4 * 32)
    samples = _lines(metrics)
    assert [s["seq"] for s in samples] == list(range(len(samples))) and samples[-1]["step"] == 3


def test_validate_and_schema(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {steps: 0}\n")
    assert main(["validate", str(bad)]) == EXIT_REFUSED
    errors = json.loads(capsys.readouterr().err)["errors"]
    assert errors[0]["key"] == "train.steps"
    assert main(["schema"]) == 0
    assert "properties" in json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_sigterm_mid_run_leaves_a_valid_result_and_metrics(tmp_path):
    strategy = tmp_path / "strategy.yaml"
    strategy.write_text(STRATEGY)
    metrics = tmp_path / "metrics.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_runtime",
            "train",
            str(strategy),
            "--steps",
            "100000",
            "--out",
            str(metrics),
            "--quiet",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and any(s["step"] >= 2 for s in _lines(metrics)):
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_SIGTERM, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "interrupted" and 2 <= result["steps"] < 100000
    assert result["tokens"] == result["steps"] * 4 * 32 and result["final_loss"] is not None
    samples = _lines(metrics)
    assert [s["seq"] for s in samples] == list(range(len(samples)))
    assert samples[-1]["step"] == result["steps"] and samples[-1]["energy_j"] == result["energy_j"]
