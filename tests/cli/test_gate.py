"""`costlab gate` decides in decimal at 0.01 percentage points,
and --evidence judges the always-valid bound.

The report is what the API answers (floats, with their noise); a stub stands in for the server.
"""

from __future__ import annotations

from argparse import Namespace
from decimal import Decimal

import pytest

from costlab_cli.client import CliError
from costlab_cli.gate import REGRESSION, cmd_gate, parse_regression


class ReportApi:
    def __init__(
        self, control: float, candidate: float, low: float | None = None, high: float | None = None
    ):
        self.report = {
            "experiment_id": 1,
            "arms": [
                {
                    "name": "control",
                    "is_control": True,
                    "metric": "usd_per_mtok",
                    "metric_value": control,
                    "deviation": 0.0,
                    "deviation_low": None,
                    "deviation_high": None,
                },
                {
                    "name": "candidate",
                    "is_control": False,
                    "metric": "usd_per_mtok",
                    "metric_value": candidate,
                    "deviation": candidate / control - 1,
                    "deviation_low": low,
                    "deviation_high": high,
                },
            ],
        }

    def get(self, path: str, **params) -> dict:
        return self.report


def gate(api, limit: str, *, evidence=False) -> int:
    return cmd_gate(
        api, Namespace(experiment=1, max_regression=limit, run=None, arm=None, evidence=evidence)
    )


@pytest.mark.parametrize(
    ("control", "candidate", "limit"),
    [
        (1.0, 1.02, "2%"),  # 1.02 / 1.0 - 1 = 0.020000000000000018 in floats
        (1.0, 1.1, "10%"),  # 0.10000000000000009
        (0.3, 0.306, "0.02"),  # 0.020000000000000018 again, the limit as a fraction
        (0.7, 0.77, "10.00%"),  # 0.10000000000000009
    ],
)
def test_a_candidate_exactly_at_the_limit_passes_whatever_the_float_noise(
    capsys, control, candidate, limit
):
    assert candidate / control - 1 != float(parse_regression(limit)) / 100  # the noise is there
    assert gate(ReportApi(control, candidate), limit) == 0
    assert capsys.readouterr().out.startswith("PASS")


def test_one_hundredth_of_a_point_past_the_limit_fails(capsys):
    assert gate(ReportApi(1.0, 1.0201), "2%") == REGRESSION
    out = capsys.readouterr().out
    assert out.startswith("REGRESSION: arm 'candidate' costs +2.01%") and "limit +2.00%" in out


def test_the_limit_is_a_decimal_at_the_gate_resolution():
    assert parse_regression("2%") == parse_regression("0.02") == Decimal("2.00")
    with pytest.raises(CliError, match="finer than the gate's resolution"):
        parse_regression("2.005%")
    with pytest.raises(CliError, match="not a finite number"):
        parse_regression("nan%")


def test_evidence_fails_only_when_the_lower_bound_clears_the_limit(capsys):
    # +8 % measured, but the always-valid bound reaches down to +1 %: not established past +5 %.
    assert gate(ReportApi(1.0, 1.08, low=0.01, high=0.15), "5%", evidence=True) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS: arm 'candidate' costs +8.00%")
    assert (
        "always-valid bounds +1.00% .. +15.00%" in out
        and "lower bound +1.00% vs limit +5.00%" in out
    )
    # Without --evidence the estimate is judged: the cautious default fails it.
    assert gate(ReportApi(1.0, 1.08, low=0.01, high=0.15), "5%") == REGRESSION
    capsys.readouterr()
    # The bound itself past the limit: a regression established at alpha.
    assert gate(ReportApi(1.0, 1.12, low=0.0501, high=0.19), "5%", evidence=True) == REGRESSION
    # Exactly at the limit, the bound does not clear it.
    assert gate(ReportApi(1.0, 1.12, low=0.05000000000000001, high=0.19), "5%", evidence=True) == 0


def test_evidence_needs_a_bound():
    with pytest.raises(CliError, match="no confidence bound yet"):
        gate(ReportApi(1.0, 1.08), "5%", evidence=True)


def with_evidence(api: ReportApi, *, runs: int, evidence_runs: int, samples: int = 500):
    """The report as a server that says its minimums and each arm's evidence answers it."""
    api.report.update(min_runs_per_arm=3, min_samples_per_arm=30, min_cs_runs_per_arm=10)
    for arm in api.report["arms"]:
        arm.update(runs=runs, evidence_runs=evidence_runs, evidence_samples=samples)
    return api


def test_a_point_estimate_on_fewer_runs_than_the_minimum_warns_on_stderr(capsys):
    assert gate(with_evidence(ReportApi(1.0, 1.147), runs=1, evidence_runs=1), "20%") == 0
    out, err = capsys.readouterr()
    assert out.startswith("PASS: arm 'candidate' costs +14.70%")
    assert err.startswith(
        "costlab gate: warning: 1 control run and 1 candidate run, fewer than the experiment's "
        "minimum of 10: a point estimate this noisy has moved ±15 % for identical strategies"
    ), err
    # The warning never changes the exit status.
    assert gate(with_evidence(ReportApi(1.0, 1.147), runs=1, evidence_runs=1), "5%") == REGRESSION
    assert "fewer than the experiment's minimum of 10" in capsys.readouterr().err
    # Enough runs, or a server that does not say its minimums: no warning.
    assert gate(with_evidence(ReportApi(1.0, 1.02), runs=10, evidence_runs=10), "5%") == 0
    assert gate(ReportApi(1.0, 1.02), "5%") == 0
    assert capsys.readouterr().err == ""


def test_evidence_decides_only_on_the_freeze_rules_minimums():
    short = with_evidence(ReportApi(1.0, 1.25, low=0.19, high=0.31), runs=3, evidence_runs=3)
    with pytest.raises(CliError) as refused:
        gate(short, "5%", evidence=True)
    message = str(refused.value)
    assert message.startswith("--evidence: arm 'candidate' cannot be decided yet")
    assert "needs 10 runs and 30 samples of each arm" in message
    assert "3 runs and 500 samples of 'candidate'" in message
    assert "of the control 'control'" in message
    ready = with_evidence(ReportApi(1.0, 1.25, low=0.19, high=0.31), runs=10, evidence_runs=10)
    assert gate(ready, "5%", evidence=True) == REGRESSION


def test_the_gate_against_a_server_warns_and_waits_for_the_evidence(lab, capsys):
    from apps.attribution.services import attribution_tick
    from tests.cli.conftest import cli, priced_run

    exp = str(lab["experiment"].pk)
    priced_run(lab["control"], "1.00")
    priced_run(lab["candidate"], "1.147")
    code, out, err = cli(capsys, "gate", exp, "--max-regression", "20%")
    assert code == 0 and out.startswith("PASS")
    assert "1 control run and 1 candidate run, fewer than the experiment's minimum of 10" in err
    for i in range(2):
        priced_run(lab["control"], f"{1.0 + 0.001 * i:.3f}")
        priced_run(lab["candidate"], f"{1.147 + 0.001 * i:.3f}")
    attribution_tick()
    code, _, err = cli(capsys, "gate", exp, "--max-regression", "5%", "--evidence")
    assert code == 2 and "cannot be decided yet: the freeze rule needs 10 runs" in err, err


@pytest.mark.parametrize("side", [0, 1])
def test_unpriced_gpu_time_cannot_pass_the_gate(side):
    """Issue 45: an H100 candidate with unpriced GPU time printed PASS -93.81 %; a priced
    candidate against an unpriced control REGRESSION +1515 %. Neither is decided now."""
    api = ReportApi(1.0, 0.062 if side else 16.15)
    api.report["arms"][side] |= {"unpriced": {"gpu": 14.0}, "unpriced_skus": ["NVIDIA H100"]}
    with pytest.raises(CliError) as refused:
        gate(api, "5%")
    said = str(refused.value)
    assert "no price for NVIDIA H100" in said and "gpu 14 s" in said, said
