"""The answer at a glance, in Chromium: the verdict card first on the experiment page and the
verdict column of the list, in each state (conclusive, inconclusive, frozen)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.attribution.services import arm_freeze, attribution_tick
from tests.apps.dashboard.world import PASSWORD, run_of, train, world
from tests.factories import ArmFactory, ExperimentFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def two_arms(tenant, name, **fields):
    experiment = ExperimentFactory(tenant=tenant, name=name, status="active", **fields)
    return (
        experiment,
        ArmFactory(experiment=experiment, name="fp32-control", is_control=True),
        ArmFactory(experiment=experiment, name="bf16-dynamic"),
    )


@pytest.fixture
def states():
    """Three experiments of one team: a conclusive one (identical runs per arm: no spread), an
    inconclusive one (runs of the candidate far apart), and one whose candidate was frozen."""
    w = world(username="analyst")
    w.user.set_password(PASSWORD)
    w.user.save()
    tenant = w.experiment.tenant
    start = timezone.now() - timedelta(minutes=5)
    # 3 runs each: conclusive only where the experiment consults its bound from 3 runs
    conclusive, c_control, c_arm = two_arms(tenant, "conclusive", min_cs_runs_per_arm=3)
    inconclusive, i_control, i_arm = two_arms(tenant, "inconclusive")
    frozen, f_control, f_arm = two_arms(tenant, "frozen")
    for control in (c_control, i_control, f_control):
        for _ in range(3):
            train(run_of(control), n=20, start=start, power_w=600.0)
    for _ in range(3):
        train(run_of(c_arm), n=20, start=start, power_w=150.0)
    for power in (50.0, 3000.0):
        train(run_of(i_arm), n=20, start=start, power_w=power)
    for _ in range(3):
        train(run_of(f_arm), n=20, start=start, power_w=900.0)
    attribution_tick(now=timezone.now())
    arm_freeze(arm_id=f_arm.pk, reason="dearer than the control beyond the threshold", evidence={})
    return w, {"conclusive": conclusive, "inconclusive": inconclusive, "frozen": frozen}


def sign_in(page, base, username):
    page.goto(base + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def test_verdict_card_and_column_in_each_state(page, live_server, states, screenshots):
    w, experiments = states
    base = live_server.url
    sign_in(page, base, w.user.username)
    expected = {
        "conclusive": ("cheaper", ["cheaper", "per 1M tokens", "95 % sure it is", "conclusive"]),
        "inconclusive": (
            "inconclusive",
            ["inconclusive", "needs about", "more run", "evidence so far"],
        ),
        "frozen": ("frozen", ["frozen at", "dearer"]),
    }
    for name, (verdict, _) in expected.items():
        cell = page.locator(
            f'#experiments tr[data-experiment="{experiments[name].pk}"] [data-col="verdict"]'
        )
        assert cell.locator(f'[data-verdict="{verdict}"]').count() == 1, (name, cell.inner_text())
    page.screenshot(path=str(screenshots / "experiments-verdicts.png"), full_page=True)

    for name, (verdict, words) in expected.items():
        page.goto(f"{base}/experiments/{experiments[name].pk}/")
        card = page.locator("#verdict-card")
        line = card.locator(f'[data-verdict="{verdict}"]')
        assert line.count() == 1, (name, card.inner_text())
        text = line.inner_text()
        for word in words:
            assert word in text, (name, word, text)
        # The card is the first thing after the title, above the comparison table and the charts.
        top = page.evaluate("""() => ['#verdict-card', '#comparison-measured', '#chart-util_pct']
                               .map(s => document.querySelector(s).getBoundingClientRect().top)""")
        assert top == sorted(top), (name, top)
        bounds = page.locator('#comparison-measured [data-col="bounds"]').all_inner_texts()
        cheaper = [re.findall(r"([\d.,]+)(?:–([\d.,]+))? % cheaper", b) for b in bounds]
        sizes = [float(x.replace(",", "")) for f in cheaper for pair in f for x in pair if x]
        assert all(size <= 100 for size in sizes), ("never more than 100 % cheaper", bounds)
        assert not any("−" in b or "[" in b for b in bounds), ("said in words (issue 44)", bounds)
        page.screenshot(path=str(screenshots / f"verdict-{name}.png"), full_page=True)
    assert not page.js_errors, page.js_errors
