"""Issue 43, the gate and the report: quality beside cost.

`costlab gate --max-quality-loss` fails a candidate whose held-out model is worse than allowed
(exit 3) or not measured (exit 4); without the flag it prints the quality line and keeps cost's
exit status. A stub stands in for the server where the branches are the point; one live server
runs the three cases of the issue end to end.
"""

from __future__ import annotations

import random
from argparse import Namespace

import pytest

from costlab_cli.gate import (
    PASS,
    QUALITY_NOT_MEASURED,
    QUALITY_REGRESSION,
    REGRESSION,
    UNDECIDED,
    cmd_gate,
)
from costlab_cli.quality import bound_words, quality_words, usd_to_target_words
from costlab_cli.report import as_markdown, as_table, columns


def quality(verdict="worse", change=0.049, low=0.031, high=0.068, **fields):
    return {
        "verdict": verdict,
        "metric": "eval_loss",
        "direction": "lower",
        "margin": 0.01,
        "value": 3.0 * (1 + change) if change is not None else None,
        "control_value": 3.0,
        "change": change,
        "change_low": low,
        "change_high": high,
        "runs": 6,
        "control_runs": 6,
        "note": "",
        **fields,
    }


class ReportApi:
    """A report of a control and one candidate 30 % cheaper per token, with the quality given."""

    def __init__(self, q: dict | None, *, verdict="cheaper", deviation=-0.3):
        arm = {
            "is_control": False,
            "metric": "usd_per_mtok",
            "deviation_low": None,
            "deviation_high": None,
        }
        self.report = {
            "experiment_id": 1,
            "quality_metric": "eval_loss",
            "arms": [
                arm
                | {
                    "name": "control",
                    "is_control": True,
                    "metric_value": 1.0,
                    "deviation": 0.0,
                    "verdict": "control",
                    "quality": quality("non_inferior", None, None, None, note="the control")
                    | {"value": 3.0},
                },
                arm
                | {
                    "name": "candidate",
                    "metric_value": 1.0 + deviation,
                    "deviation": deviation,
                    "verdict": verdict,
                    "quality": q,
                },
            ],
        }

    def get(self, path: str, **params) -> dict:
        return self.report


def gate(api, *, quality_loss: str | None = "1%", evidence=False, cost="5%") -> int:
    return cmd_gate(
        api,
        Namespace(
            experiment=1,
            max_regression=cost,
            max_quality_loss=quality_loss,
            run=None,
            arm=None,
            evidence=evidence,
        ),
    )


def test_the_quality_words_are_one_wording():
    assert quality_words(quality()) == "held-out loss 4.9 % worse (bound 3.1–6.8 % worse)"
    assert (
        quality_words(quality("non_inferior", 0.001, -0.002, 0.004))
        == "held-out loss non-inferior within 1 % (0.1 % worse; bound 0.2 % better to 0.4 % worse)"
    )
    assert (
        quality_words(quality("not_measured", None, note="no finished run of the arm evaluated"))
        == "held-out loss not measured (no finished run of the arm evaluated)"
    )
    assert quality_words(None, metric="accuracy") == (
        "accuracy not measured (no attribution window has compared it yet)"
    )
    assert quality_words(quality("inconclusive", 0.005, None, None, note="the arm has 1 of 3")) == (
        "held-out loss 0.5 % worse, inconclusive (the arm has 1 of 3)"
    )
    assert bound_words(-0.041, -0.02) == "bound 2.0–4.1 % better"
    assert usd_to_target_words({"runs_evaluated": 0}, target=3.0) == "-"
    assert (
        usd_to_target_words({"runs_evaluated": 4, "runs_reached_target": 0}, target=3.0)
        == "not reached (0/4 runs)"
    )
    assert (
        usd_to_target_words(
            {"runs_evaluated": 4, "runs_reached_target": 3, "usd_to_target": 0.7012}, target=3.0
        )
        == "≈0.7012 (3/4 runs)"
    )


def test_a_cheaper_but_worse_arm_fails_the_quality_gate_with_its_own_code(capsys):
    api = ReportApi(quality(), verdict="cheaper_but_worse")
    assert gate(api) == QUALITY_REGRESSION
    cost, said = capsys.readouterr().out.splitlines()
    assert cost.startswith("PASS: arm 'candidate' costs -30.00% USD/1M tokens")
    assert said == (
        "QUALITY REGRESSION: arm 'candidate' held-out loss 4.9 % worse (bound 3.1–6.8 % worse) "
        "vs control 'control' (3.1470 vs 3.0000; lower bound +3.10% vs limit +1.00%)"
    )
    # A looser limit than the experiment's own margin never passes what the server proved worse.
    assert gate(api, quality_loss="5%") == QUALITY_REGRESSION
    out = capsys.readouterr().out
    assert (
        "lower bound +3.10% vs limit +5.00%; proven worse beyond the experiment's 1 % margin"
        in (out)
    )
    # A cost regression as well: cost's exit status, both lines said.
    assert gate(ReportApi(quality(), verdict="worse", deviation=0.2)) == REGRESSION
    assert "QUALITY REGRESSION" in capsys.readouterr().out


def test_non_inferior_passes_and_not_measured_fails_with_its_own_code(capsys):
    assert gate(ReportApi(quality("non_inferior", 0.001, -0.002, 0.004))) == PASS
    assert capsys.readouterr().out.splitlines()[1] == (
        "PASS: arm 'candidate' held-out loss non-inferior within 1 % (0.1 % worse; bound 0.2 % "
        "better to 0.4 % worse) vs control 'control' (3.0030 vs 3.0000; upper bound +0.40% vs "
        "limit +1.00%)"
    )
    # Tighter than the evidence shows: not proven within 0.3 %, judged on the estimate, warned.
    assert gate(ReportApi(quality("non_inferior", 0.001, -0.002, 0.004)), quality_loss="0.3%") == 0
    out, err = capsys.readouterr()
    assert "estimate +0.10% vs limit +0.30%" in out and "not proven either way" in err
    for q in (None, quality("not_measured", None, None, None, note="no finished run of the arm")):
        assert gate(ReportApi(q)) == QUALITY_NOT_MEASURED
        said = capsys.readouterr().out.splitlines()[1]
        assert said.startswith("QUALITY NOT MEASURED: arm 'candidate' held-out loss not measured")
        assert "--max-quality-loss 1 % fails an arm whose quality is not measured" in said


def test_evidence_waits_for_a_quality_bound_that_decides(capsys):
    spanning = quality("inconclusive", 0.008, -0.004, 0.02)
    assert gate(ReportApi(spanning), evidence=False) == PASS  # the estimate, +0.80 %, is within
    assert "estimate +0.80% vs limit +1.00%" in capsys.readouterr().out
    api = ReportApi(spanning)
    for arm in api.report["arms"]:
        arm.update(deviation_low=arm["deviation"] - 0.1, deviation_high=arm["deviation"] + 0.1)
    assert gate(api, evidence=True) == UNDECIDED
    err = capsys.readouterr().err
    assert err.startswith(
        "costlab gate: error: --evidence: the quality of arm 'candidate' cannot be "
    )
    assert "bound 0.4 % better to 2.0 % worse); gate without --evidence or wait" in err


def test_without_the_flag_quality_is_said_and_a_worse_model_warned_but_cost_decides(capsys):
    assert gate(ReportApi(quality(), verdict="cheaper_but_worse"), quality_loss=None) == PASS
    out, err = capsys.readouterr()
    assert out.splitlines()[1] == (
        "quality (not gated): arm 'candidate' held-out loss 4.9 % worse (bound 3.1–6.8 % worse) "
        "vs control 'control' (3.1470 vs 3.0000)"
    )
    assert err == (
        "costlab gate: warning: arm 'candidate' reads cheaper_but_worse: cheaper per token, but "
        "proven worse beyond the experiment's 1 % quality margin: held-out loss 4.9 % worse "
        "(bound 3.1–6.8 % worse); this gate judges cost only: add --max-quality-loss to fail on "
        "it\n"
    )
    assert gate(ReportApi(None), quality_loss=None) == PASS
    assert capsys.readouterr().out.splitlines()[1] == (
        "quality (not gated): arm 'candidate' held-out loss not measured (no attribution window "
        "has compared it yet)"
    )


def test_the_report_shows_quality_and_the_estimated_cost_to_it():
    api = ReportApi(quality(), verdict="cheaper_but_worse")
    report = api.report | {
        "name": "batching",
        "threshold": 0.05,
        "quality_margin": 0.01,
        "quality_direction": "lower",
        "quality_target": 3.0,
    }
    for arm, usd, reached in zip(report["arms"], (1.2, None), (4, 0), strict=True):
        arm.update(
            state="active",
            runs=4,
            gpu_hours=0.1,
            energy_kwh=0.2,
            energy_estimated=False,
            total_usd=4.0,
            usd_per_mtok=arm["metric_value"],
            usd_to_target=usd,
            runs_reached_target=reached,
            runs_evaluated=4,
        )
    table = as_table(report)
    head, _, control, candidate = table.splitlines()[1:5]
    assert columns(report)[6:10] == ["USD/1M tok", "≈USD to target", "held-out loss", "quality"]
    assert head.index("USD/1M tok") < head.index("≈USD to target") < head.index("held-out loss")
    assert "≈1.2000 (4/4 runs)" in control and "3.0000" in control
    assert (
        "not reached (0/4 runs)" in candidate
        and "3.1470" in candidate
        and "4.9 % worse" in candidate
    )
    assert "cheaper_but_worse" in candidate
    assert "held-out loss (lower is better) against the control, margin 1 %" in table
    assert "≈: estimated USD a run took to reach the control's mean held-out loss 3.0000" in table
    markdown = as_markdown(report)
    assert "| ≈USD to target | held-out loss | quality |" in markdown
    assert "| not reached (0/4 runs) | 3.1470 | 4.9 % worse |" in markdown
    assert "unpriced:" not in table
    report["arms"][1] |= {"unpriced": {"gpu": 14.0}, "unpriced_skus": ["NVIDIA H100"]}
    said = "unpriced: arm 'candidate' gpu 14 s (no price for NVIDIA H100); not compared"
    assert said in as_table(report) and said in as_markdown(report)


@pytest.fixture
def quality_lab(lab):
    """The lab's experiment with four arms, four runs each, every one priced and finished: the
    control; 'candidate', 30 % cheaper per token with a 5 % worse held-out loss; 'twin', 30 %
    cheaper at the control's loss; 'blind', 30 % cheaper and never evaluated. Then one tick."""
    from django.utils import timezone

    from apps.attribution.services import attribution_tick
    from tests.cli.conftest import CANDIDATE, priced_run
    from tests.factories import ArmFactory, final_evaluation

    experiment = lab["experiment"]
    experiment.min_runs_per_arm = experiment.min_cs_runs_per_arm = 3
    experiment.min_samples_per_arm = 1
    experiment.save()
    arms = {"control": (lab["control"], 1.0, 3.0), "candidate": (lab["candidate"], 0.7, 3.15)}
    for name, steps, loss in (("twin", 9, 3.0), ("blind", 11, None)):
        arm = ArmFactory(
            experiment=experiment,
            name=name,
            strategy_yaml=CANDIDATE.replace("steps: 7", f"steps: {steps}"),
        )
        arms[name] = (arm, 0.7, loss)
    rng, now = random.Random(5), timezone.now()
    for _ in range(4):
        for arm, usd, loss in arms.values():
            run = priced_run(arm, f"{usd * (1 + 0.01 * rng.gauss(0, 1)):.6f}", finished_at=now)
            if loss is not None:
                final_evaluation(run, loss * (1 + 0.001 * rng.gauss(0, 1)), at=now)
    attribution_tick()
    return str(experiment.pk)


def test_the_quality_gate_against_a_server(quality_lab, capsys):
    """The issue's cases through a live server: 30 % cheaper with a 5 % worse held-out loss fails
    with exit 3, 30 % cheaper at equal loss passes, an arm never evaluated fails with exit 4."""
    from tests.cli.conftest import cli

    def gate_arm(arm, *flags):
        return cli(capsys, "gate", quality_lab, "--arm", arm, "--max-regression", "5%", *flags)

    code, out, _ = gate_arm("candidate", "--max-quality-loss", "1%")
    cost, said = out.splitlines()
    assert code == QUALITY_REGRESSION and cost.startswith("PASS: arm 'candidate' costs -29.")
    assert said.startswith("QUALITY REGRESSION: arm 'candidate' held-out loss 4.9 % worse (bound ")
    assert "vs control 'control' (3.1482 vs 3.0000; lower bound +4." in said, said
    code, out, _ = gate_arm("twin", "--max-quality-loss", "1%")
    assert code == PASS and out.splitlines()[1].startswith(
        "PASS: arm 'twin' held-out loss non-inferior within 1 % (0.0 % worse; bound "
    ), out
    code, out, _ = gate_arm("blind", "--max-quality-loss", "1%")
    assert code == QUALITY_NOT_MEASURED and out.splitlines()[1].startswith(
        "QUALITY NOT MEASURED: arm 'blind' held-out loss not measured (no finished run of the arm "
        "evaluated eval_loss)"
    ), out
    # Without the flag: cost decides, the quality is said and the worse model warned.
    code, out, err = gate_arm("candidate")
    assert code == PASS and out.splitlines()[1].startswith(
        "quality (not gated): arm 'candidate' held-out loss 4.9 % worse"
    )
    assert err.startswith("costlab gate: warning: arm 'candidate' reads cheaper_but_worse: ")

    code, table, _ = cli(capsys, "report", quality_lab)
    rows = {line.split()[0]: line for line in table.splitlines()[3:7]}
    assert code == 0 and "≈USD to target" in table
    assert "not reached (0/4 runs)" in rows["candidate"] and "4.9 % worse" in rows["candidate"]
    assert "cheaper_but_worse" in rows["candidate"]
    assert "≈0.69" in rows["twin"] and "non-inferior within 1 %" in rows["twin"]
    assert "not measured" in rows["blind"]
