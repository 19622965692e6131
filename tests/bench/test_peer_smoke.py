"""bench/peer.py (costlab against transformers.Trainer) cannot rot: its `--smoke` (a tiny llama
checkpoint built locally, one round of 3 costlab steps per arm, seconds) runs as a separate
process, and its last stdout line must be the JSON object of a real run: every key, every arm's
figures as numbers, the headline ratio a positive number. What the figures are worth is not
checked: a smoke run's figures mean nothing, and the benchmark's targets do not fail it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.helpers import ROOT, clean_env

ARMS = ("trainer_default", "trainer_best", "costlab_default", "costlab_optimized")
TOP_KEYS = (
    "ratio",
    "ratio_spread",
    "ratios",
    "target",
    "met",
    "eval_loss_delta",
    "loss_within_2pct",
    "arms",
    "where_time_goes",
    "trainer_best_flags",
    "costlab_strategies",
    "device",
    "profile",
    "best_dtype",
    "price_per_hour_usd",
    "price_assumed",
    "rounds",
    "steps",
    "interrupted",
)
ARM_NUMBERS = (
    "trained_tokens_per_s",
    "usd_per_1m_trained_tokens",
    "peak_mem_mb",
    "eval_loss",
    "trained_tokens",
)


def number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
def test_peer_smoke_prints_every_arm_and_a_positive_ratio():
    proc = subprocess.run(
        [sys.executable, "bench/peer.py", "--smoke", "--json"],
        cwd=ROOT,
        env=clean_env(PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    tail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"bench/peer.py exited {proc.returncode}\n{tail}"
    figures = json.loads(proc.stdout.strip().splitlines()[-1])

    for key in TOP_KEYS:
        assert key in figures, (key, sorted(figures))
    assert number(figures["ratio"]) and figures["ratio"] > 0, figures["ratio"]
    assert figures["rounds"] >= 1 and figures["interrupted"] is False
    assert figures["price_assumed"] is True
    assert isinstance(figures["loss_within_2pct"], bool)
    assert number(figures["eval_loss_delta"])
    spread = figures["ratio_spread"]
    assert spread["min"] <= spread["median"] <= spread["max"], spread
    for pair, ratio in figures["ratios"].items():
        assert number(ratio["median"]) and ratio["median"] > 0, (pair, ratio)
    for arm in ARMS:
        row = figures["arms"][arm]
        for key in ARM_NUMBERS:
            assert number(row[key]), (arm, key, row[key])
        assert row["trained_tokens_per_s"] > 0 and row["eval_loss"] > 0, (arm, row)
        where = figures["where_time_goes"][arm]
        assert 0 <= where["padding_share"] < 1 and where["step_s"] > 0, (arm, where)
    # equal work: every arm trained about costlab's count of trained tokens
    target = figures["target_tokens_per_run"]
    for arm in ARMS:
        assert figures["arms"][arm]["trained_tokens"] >= 0.5 * target, (arm, target)
    # --smoke always runs the operator breakdown, so its code path is exercised too
    ops = figures["where_time_goes"]["op_breakdown"]
    for arm in ("trainer_best", "costlab_optimized"):
        assert number(ops[arm]["us_per_trained_token"]["gemm"]), ops[arm]
    # the flags trainer_best used, each with its reason
    for flag in figures["trainer_best_flags"].values():
        assert flag["why"], flag
