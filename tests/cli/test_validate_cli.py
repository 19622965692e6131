"""`costlab validate` and the warnings of arm writes against a live server: a dtype emulated on
every device of a queue is a warning naming the key (exit 0), a strategy refused exits 1 naming
the key."""

from __future__ import annotations

import copy

import pytest

from apps.devices.services import device_profile_record
from apps.experiments.models import Arm
from costlab_cli.submit import strategy_digest
from tests.cli.conftest import CANDIDATE, CONTROL, cli
from tests.factories import XEON_AMX, device_profile

pytestmark = pytest.mark.slow

BF16 = CONTROL + "precision: {compute_dtype: bf16}\n"


def record(profile: dict, *, queues=("cpu",)):
    device_profile_record(host="worker-1", label="cpu", queues=list(queues), profile=profile)


def test_validate_warns_naming_the_key_and_exits_0(lab, capsys, strategy):
    record(device_profile())  # AVX2 only: bf16 is emulated
    code, out, err = cli(capsys, "validate", strategy(BF16))
    assert code == 0, err
    assert out == f"valid {strategy_digest(BF16)}"
    [line] = err.splitlines()
    assert line.startswith("costlab validate: warning: precision.compute_dtype: bf16 runs at 0.02x")
    assert "expect it dearer" in line and "(on the cpu queue, 1 measured)" in line

    code, out, err = cli(capsys, "validate", strategy(CONTROL))
    assert (code, out, err) == (0, f"valid {strategy_digest(CONTROL)}", ""), "fp32: nothing to say"
    code, out, err = cli(capsys, "validate", strategy(BF16), "--queue", "gpu")
    assert code == 0 and out.startswith("valid ") and err == "", "the gpu queue has seen no device"


def test_validate_says_nothing_where_a_device_runs_the_dtype_natively(lab, capsys, strategy):
    record(device_profile(XEON_AMX))
    code, out, err = cli(capsys, "validate", strategy(BF16))
    assert (code, out, err) == (0, f"valid {strategy_digest(BF16)}", "")


def test_a_refused_strategy_exits_1_naming_the_key(lab, capsys, strategy):
    code, out, err = cli(capsys, "validate", strategy(CONTROL.replace("steps: 5", "steps: 0")))
    assert code == 1 and out == ""
    assert err.startswith("costlab validate: invalid: strategy_yaml: train.steps:"), err

    broken = copy.deepcopy(device_profile())
    broken["dtypes"]["bf16"].update(gflops=None, ratio_vs_fp32=None, error="no kernel: bf16")
    record(broken)
    code, out, err = cli(capsys, "validate", strategy(BF16))
    assert code == 1 and out == ""
    assert "precision.compute_dtype" in err and "cannot run on any device" in err, err

    code, _, err = cli(capsys, "validate", "/nonexistent.yaml")
    assert code == 2 and "STRATEGY_FILE: cannot read /nonexistent.yaml" in err


def test_submit_prints_the_warnings_of_the_arm_it_creates_or_updates(lab, capsys, strategy):
    record(device_profile())
    exp = str(lab["experiment"].pk)
    code, out, err = cli(
        capsys, "submit", "--experiment", exp, "--strategy", strategy(BF16), "--arm", "pr-7"
    )
    assert code == 0 and "on arm 'pr-7' (created)" in out, err
    [line] = err.splitlines()
    assert line.startswith("costlab submit: warning: precision.compute_dtype: bf16 runs at")

    code, out, err = cli(
        capsys, "submit", "--experiment", exp, "--strategy", strategy(CANDIDATE), "--arm", "pr-7"
    )
    assert code == 0 and "(updated revision 2)" in out and err == "", "fp32 again: no warning"
    bf16_again = BF16 + "# v3\n"
    code, out, err = cli(
        capsys, "submit", "--experiment", exp, "--strategy", strategy(bf16_again), "--arm", "pr-7"
    )
    assert code == 0 and "(updated revision 3)" in out
    assert "costlab submit: warning: precision.compute_dtype:" in err
    assert Arm.objects.get(name="pr-7").strategy_yaml == bf16_again


def test_a_strategy_over_the_size_limit_is_refused_with_exit_1(lab, capsys, strategy):
    """Issue 45: a body over the size limit is the strategy refused (1), not an error (2)."""
    huge = CONTROL + "# " + "x" * (2 * 1024 * 1024) + "\n"
    code, out, err = cli(capsys, "validate", strategy(huge))
    assert code == 1 and out == "", err
    assert err.startswith("costlab validate: invalid: "), err
