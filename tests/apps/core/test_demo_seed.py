"""The demo seed labels its prices as examples and can run any number of times."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.experiments.models import Arm, Experiment
from apps.pricing.models import GpuPrice, GpuSku, PricingTable
from apps.tenants.models import Membership, Tenant

pytestmark = pytest.mark.django_db

MODELS = (Tenant, PricingTable, GpuSku, GpuPrice, Experiment, Arm, Membership, get_user_model())


def counts():
    return {m.__name__: m.objects.count() for m in MODELS}


def test_seed_is_idempotent_and_prints_a_generated_password_once(capsys):
    call_command("seed_demo")
    first_out = capsys.readouterr().out
    after_first = counts()
    call_command("seed_demo")
    second_out = capsys.readouterr().out
    assert counts() == after_first
    assert all(n >= 1 for n in after_first.values())

    assert "password:" in first_out and "password:" not in second_out
    password = first_out.split("password:")[1].split()[0]
    assert len(password) >= 12
    assert get_user_model().objects.get(username="admin").check_password(password)


def test_seeded_prices_are_labelled_example():
    call_command("seed_demo")
    table = PricingTable.objects.get()
    assert table.is_example and "EXAMPLE" in table.notes
    assert "example" in str(table).lower()
    assert Arm.objects.filter(is_control=True).count() == 1


def test_seed_can_queue_demo_runs_once(django_capture_on_commit_callbacks):
    from apps.experiments.models import Run

    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        call_command("seed_demo", "--submit-runs", "2")
        call_command("seed_demo", "--submit-runs", "2")  # runs still queued: nothing more
    assert Run.objects.count() == 6 and len(enqueued) == 6
    assert set(Run.objects.values_list("arm__name", flat=True)) == {
        "pytorch-baseline",
        "costlab-optimized",
        "big-batch",
    }


def test_seeding_again_after_the_demo_runs_finished_queues_nothing(
    django_capture_on_commit_callbacks,
):
    from apps.experiments.models import Run

    with django_capture_on_commit_callbacks(execute=False):
        call_command("seed_demo", "--submit-runs", "2")
    Run.objects.update(
        status=Run.Status.SUCCEEDED
    )  # the demo ran to the end; make run starts again
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        call_command("seed_demo", "--submit-runs", "2")
    assert Run.objects.count() == 6 and enqueued == []


def _flat(config, prefix=""):
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_demo_description_says_exactly_what_its_arms_configs_differ_in():
    from apps.demo.services import CONTROL_STRATEGY, DEMO_DESCRIPTION, OPTIMIZED_STRATEGY
    from gpu_runtime import load_strategy

    control = _flat(load_strategy(CONTROL_STRATEGY).model_dump())
    optimized = _flat(load_strategy(OPTIMIZED_STRATEGY).model_dump())
    differ = {key for key in control if control[key] != optimized[key]}
    described = {
        "precision.compute_dtype",
        "optimizer.dynamic_batching.enabled",
        "optimizer.dynamic_batching.min_micro_batch",
        "optimizer.dynamic_batching.max_micro_batch",
        "optimizer.dynamic_batching.probe_steps",
        "kernels.compile",
    }
    assert differ <= described, (
        f"the arms differ in keys the description does not mention: {differ - described}"
    )
    text = DEMO_DESCRIPTION
    control_part = text.split("Optimized:")[0]
    optimized_part = text.split("Optimized:")[1].split("Big batch:")[0]
    assert (
        f"{control['precision.compute_dtype']}, micro-batch {control['train.micro_batch']}"
        in control_part
    )
    # The optimized arm never forces a dtype the host may emulate: auto, from the profile.
    assert optimized["precision.compute_dtype"] == "auto"
    assert "auto precision" in optimized_part and "measured profile" in optimized_part
    # compile auto: said as the payback rule it is, not as a promise to compile
    assert optimized["kernels.compile"] == "auto" and "compile auto" in optimized_part
    assert "long enough to repay the compile" in optimized_part
    dyn = "optimizer.dynamic_batching."
    assert optimized[dyn + "enabled"] and not control[dyn + "enabled"]
    assert (
        f"dynamic batching growing the micro-batch from {optimized[dyn + 'min_micro_batch']} up to "
        f"{optimized[dyn + 'max_micro_batch']}"
    ) in optimized_part
    assert (
        optimized["train.micro_batch"]
        == control["train.micro_batch"]
        == optimized[dyn + "min_micro_batch"]
    )
    # auto may stay at 1 on a host where a larger micro-batch buys nothing: said, not promised
    assert "1 on a host where larger micro-batches buy nothing" in optimized_part
    assert "run's page says what auto chose" in text
    assert f"global batch of {control['train.global_batch']}" in text
    assert (
        f"{control['model.preset']} preset, seq_len {control['model.seq_len']}, "
        f"{control['train.steps']} steps, {control['data.source']} data"
    ) in text
    # nothing promised that neither arm does
    switched_on = {
        "checkpointing": optimized["memory.gradient_checkpointing.enabled"],
        "compile": optimized["kernels.compile"] is not False,
        "fused": optimized["kernels.fused_optimizer"] or optimized["kernels.fused_rmsnorm_qkv"],
        "int8": optimized["precision.quantization.enabled"],
        "offload": optimized["offload.embedding"] != "none",
        "prefetch": optimized["data.prefetch"] != control["data.prefetch"],
        "auto precision": optimized["precision.compute_dtype"] == "auto",
        "dynamic batching": optimized[dyn + "enabled"],
    }
    for word, on in switched_on.items():
        assert (word in text.lower()) == on, f"description and config disagree on {word!r}"


def test_demo_runs_are_queued_interleaved_and_the_experiment_holds_demo_evidence_minimums(
    django_capture_on_commit_callbacks,
):
    from apps.demo.services import DEMO_EXPERIMENT, DEMO_NAME
    from apps.experiments.models import Run

    with django_capture_on_commit_callbacks(execute=False):
        call_command("seed_demo", "--submit-runs", "3")
    arms = list(Run.objects.order_by("pk").values_list("arm__name", flat=True))
    assert arms == ["pytorch-baseline", "costlab-optimized", "big-batch"] * 3
    experiment = Experiment.objects.get(name=DEMO_NAME)
    assert {k: getattr(experiment, k) for k in DEMO_EXPERIMENT} == DEMO_EXPERIMENT


def test_the_big_batch_arm_trains_the_same_tokens_with_a_quarter_of_the_updates():
    """The third arm is cheaper but worse by construction, and its description says how."""
    from apps.demo.services import BIG_BATCH_STRATEGY, CONTROL_STRATEGY, DEMO_DESCRIPTION
    from gpu_runtime import load_strategy

    control, big = load_strategy(CONTROL_STRATEGY), load_strategy(BIG_BATCH_STRATEGY)
    tokens = [s.train.steps * s.train.global_batch * s.model.seq_len for s in (control, big)]
    assert abs(tokens[1] / tokens[0] - 1) < 0.1  # about the same tokens
    assert big.train.steps * 3 < control.train.steps and big.train.lr == control.train.lr
    assert big.eval.holdout == control.eval.holdout  # every arm on the same held-out records
    said = DEMO_DESCRIPTION.split("Big batch:")[1]
    assert f"global batch of {big.train.global_batch}" in said
    assert f"micro-batches of {big.train.micro_batch} for {big.train.steps} steps" in said


def test_the_demo_leaves_room_in_the_quota_for_a_new_users_runs(django_capture_on_commit_callbacks):
    """make run queues 2 runs per arm; a new user's first submissions must not be refused by the
    quota, and once it is full, the refusal names the limit."""
    from apps.core.exceptions import ApplicationError
    from apps.experiments.models import Run
    from apps.experiments.services import run_submit

    with django_capture_on_commit_callbacks(execute=False):
        call_command("seed_demo", "--submit-runs", "2")
        experiment = Experiment.objects.get()
        for _ in range(4):
            run_submit(experiment=experiment)  # a new user's first runs
        tenant = Tenant.objects.get(slug="demo")
        while (
            Run.objects.filter(status__in=Run.ACTIVE_STATUSES).count() < tenant.max_concurrent_runs
        ):
            run_submit(experiment=experiment)
        with pytest.raises(ApplicationError) as refused:
            run_submit(experiment=experiment)
    assert str(refused.value).startswith(
        "max_concurrent_runs:"
    ) and f"limit {tenant.max_concurrent_runs}" in str(refused.value)
