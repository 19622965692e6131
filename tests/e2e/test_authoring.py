"""Authoring in a real browser: create an experiment with two arms (the strategy editor naming a bad
key as it is typed), submit runs, see them queued on the runs page, and see a real worker train
them."""

from __future__ import annotations

import pytest

from apps.experiments.models import Experiment, Run
from tests.apps.dashboard.world import PASSWORD
from tests.factories import MembershipFactory, PricingTableFactory, UserFactory
from tests.helpers import purge_run_queues, start_worker, stop_worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.django_db(transaction=True)]

# Three tiny steps: a worker trains it in seconds.
TINY = """model: {family: llama, preset: tiny, seq_len: 16}
data: {source: synthetic, prefetch: 0}
train: {steps: 3, global_batch: 2, lr: 3.0e-4, warmup_steps: 1, seed: 0}
precision: {compute_dtype: fp32}
telemetry: {interval_s: 0.2}
"""


def sign_in(page, live_server, user, path: str) -> None:
    page.goto(live_server.url + path)
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + path)


def test_create_an_experiment_with_two_arms_submit_runs_and_see_them_train(
    page, live_server, screenshots
):
    table = PricingTableFactory()
    user = UserFactory()
    MembershipFactory(user=user, tenant=table.tenant)
    from tests.factories import CostModelFactory

    CostModelFactory(tenant=table.tenant, name="resource weighted")
    sign_in(page, live_server, user, "/")
    page.click("#create-experiment")
    page.wait_for_url(live_server.url + "/experiments/new/")

    page.fill("#id_name", "made in the browser")
    page.select_option("#id_status", "active")
    # Arm 1: the control, from an example, then typed over with a mistake the editor names by key.
    page.fill("#id_arms-0-name", "fp32-control")
    page.select_option("#example-0", "tiny")
    page.wait_for_function(
        "() => document.querySelector('[data-status-for=id_arms-0-strategy_yaml]')"
        ".textContent.includes('valid strategy')"
    )
    page.fill("#id_arms-0-strategy_yaml", TINY.replace("steps: 3,", "steps: -1,"))
    status = page.locator("[data-status-for=id_arms-0-strategy_yaml]")
    page.wait_for_function(
        "() => document.querySelector('[data-status-for=id_arms-0-strategy_yaml]')"
        ".textContent.includes('train.steps')"
    )
    assert "✗" in status.inner_text()
    page.fill("#id_arms-0-strategy_yaml", TINY)
    page.wait_for_function(
        "() => document.querySelector('[data-status-for=id_arms-0-strategy_yaml]')"
        ".textContent.includes('valid strategy')"
    )
    # Arm 2: the candidate.
    page.fill("#id_arms-1-name", "bf16")
    page.fill(
        "#id_arms-1-strategy_yaml", TINY.replace("compute_dtype: fp32", "compute_dtype: bf16")
    )
    page.uncheck("#id_arms-1-is_control")
    page.screenshot(path=str(screenshots / "experiment-form.png"), full_page=True)
    page.click("#save-experiment")
    page.wait_for_load_state()
    assert not page.locator(".error").count(), page.locator(".error").all_inner_texts()
    experiment = wait_for(
        lambda: Experiment.objects.filter(name="made in the browser").first(), 10, "the experiment"
    )
    page.wait_for_url(live_server.url + f"/experiments/{experiment.pk}/")
    assert "created" in page.locator("#messages").inner_text()
    assert sorted(experiment.arms.values_list("name", "is_control")) == [
        ("bf16", False),
        ("fp32-control", True),
    ]
    assert experiment.arms.get(name="fp32-control").strategy_yaml == TINY

    # Submit two runs, one per arm is not promised (weights route them): both appear on the runs
    # page.
    purge_run_queues()
    page.click("text=Submit runs")
    page.fill("#id_count", "2")
    page.click("#queue-runs")
    page.wait_for_url(f"**/runs/?experiment={experiment.pk}")
    rows = page.locator("#run-table tbody tr")
    assert rows.count() == 2
    assert "2 runs queued" in page.locator("#messages").inner_text()
    assert all("Queued" in t for t in rows.locator('[data-col="status"]').all_inner_texts())

    # A real worker trains them; the runs page shows them succeeded.
    worker, _ = start_worker(queues="cpu")
    try:
        wait_for(
            lambda: (
                Run.objects.filter(experiment=experiment, status=Run.Status.SUCCEEDED).count() == 2
            ),
            120,
            "both runs to train",
        )
    finally:
        stop_worker(worker)
    page.reload()
    assert rows.locator('[data-col="status"]').all_inner_texts() == ["Succeeded", "Succeeded"]
    assert all(int(s) == 3 for s in rows.locator('[data-col="steps"]').all_inner_texts())
    page.screenshot(path=str(screenshots / "runs-page.png"), full_page=True)
    assert not page.js_errors, page.js_errors


def test_start_a_sweep_with_the_strategy_checked_as_typed(page, live_server, screenshots):
    from apps.sweeps.models import Sweep

    table = PricingTableFactory()
    user = UserFactory()
    MembershipFactory(user=user, tenant=table.tenant)
    sign_in(page, live_server, user, "/sweeps/")
    page.click("#start-sweep")
    page.wait_for_url(live_server.url + "/sweeps/new/")
    status = "[data-status-for=id_base_strategy_yaml]"
    page.wait_for_function(
        f"() => document.querySelector('{status}').textContent.includes('valid strategy')"
    )
    page.fill("#id_base_strategy_yaml", TINY.replace("seq_len: 16", "seq_len: 3"))
    page.wait_for_function(
        f"() => document.querySelector('{status}').textContent.includes('model.seq_len')"
    )
    page.fill("#id_base_strategy_yaml", TINY)
    page.wait_for_function(
        f"() => document.querySelector('{status}').textContent.includes('valid strategy')"
    )
    page.fill("#id_name", "from the browser")
    page.fill("#id_space", '{"train.global_batch": [1, 2]}')
    page.screenshot(path=str(screenshots / "sweep-form.png"), full_page=True)
    page.click("button#start-sweep")
    sweep = wait_for(lambda: Sweep.objects.filter(name="from the browser").first(), 10, "the sweep")
    page.wait_for_url(live_server.url + f"/sweeps/{sweep.pk}/")
    assert "started" in page.locator("#messages").inner_text()
    assert not page.js_errors, page.js_errors


def test_a_fixed_strategy_clears_the_error_the_last_save_gave(page, live_server):
    """The save's error under a strategy is about the text that was saved: once the text is edited
    and checks valid, that error goes, so "✓ valid" never stands above a stale "✗"."""
    table = PricingTableFactory()
    user = UserFactory()
    MembershipFactory(user=user, tenant=table.tenant)
    from tests.factories import CostModelFactory

    CostModelFactory(tenant=table.tenant, name="resource weighted")
    sign_in(page, live_server, user, "/experiments/new/")
    page.fill("#id_name", "fixed in the browser")
    page.fill("#id_arms-0-name", "control")
    page.fill("#id_arms-0-strategy_yaml", TINY.replace("steps: 3,", "steps: -1,"))
    page.fill("#id_arms-1-name", "candidate")
    page.fill("#id_arms-1-strategy_yaml", TINY)
    page.click("#save-experiment")
    page.wait_for_load_state()
    arm = page.locator('fieldset[data-arm-index="0"]')
    stale = arm.locator('.error[data-error-for="strategy_yaml"]')
    assert "train.steps" in stale.inner_text(), "the save refused the bad strategy, by key"

    page.fill("#id_arms-0-strategy_yaml", TINY)
    page.wait_for_function(
        "() => document.querySelector('[data-status-for=id_arms-0-strategy_yaml]')"
        ".textContent.includes('valid strategy')"
    )
    assert stale.count() == 0 or not stale.first.is_visible(), stale.all_inner_texts()
    assert not page.js_errors, page.js_errors
