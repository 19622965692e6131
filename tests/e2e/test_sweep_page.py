"""A sweep's page in a real browser: the scatter (probes, frontier line, infeasible marked), a probe
landing while the page is open, and the screenshot the README shows."""

from __future__ import annotations

import pytest

from apps.demo.services import demo_seed
from apps.sweeps import probes, services
from tests.e2e.test_dashboard import TRACE_POINTS, sign_in
from workers.sweeps import probe_execute

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BASE = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 1000, global_batch: 2}\n"
)
LANDED = "() => document.querySelectorAll('#probes tbody tr td:nth-child(5)').length"


@pytest.fixture
def one_thread():
    """Probes here share two cores with Chromium and the live server: one torch thread keeps steps
    steady."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_sweep_page_draws_the_frontier_and_follows_landing_probes(
    page, live_server, screenshots, monkeypatch, one_thread
):
    monkeypatch.setattr(probes, "probe_send", lambda **_: None)  # probes run in this process
    seed = demo_seed()
    sweep = services.sweep_create(
        tenant=seed.experiment.tenant,
        name="batch x seq_len",
        base_strategy_yaml=BASE,
        probe_count=6,
        probe_steps=4,
        parallelism=1,
        sampler="grid",
        space={
            "train.global_batch": [1, 2, 4],
            "train.micro_batch": [2],
            "model.seq_len": [16, 32],
        },
    )
    for _ in range(3):
        probe_execute(sweep.probes.get(status="queued").pk)
    sign_in(page, live_server, seed, f"/sweeps/{sweep.pk}/")
    page.wait_for_function("() => document.getElementById('sweep-chart').data")
    measured = sweep.probes.filter(status="succeeded").count()
    infeasible = sweep.probes.filter(status="infeasible").count()
    assert page.evaluate(TRACE_POINTS, ["sweep-chart", "probes"]) == measured
    assert page.evaluate(TRACE_POINTS, ["sweep-chart", "infeasible"]) == infeasible
    assert page.evaluate(TRACE_POINTS, ["sweep-chart", "frontier"]) >= 1
    # A probe lands while the page is open: it shows up without a manual reload.
    probe_execute(sweep.probes.get(status="queued").pk)
    page.wait_for_function(
        f"() => document.getElementById('sweep-chart').data && "
        f"document.querySelectorAll('#probes tbody tr').length === {sweep.probes.count()}"
    )
    while sweep.probes.filter(status="queued").exists():
        probe_execute(sweep.probes.get(status="queued").pk)
    page.wait_for_selector("#sweep-status:has-text('Completed')", timeout=15_000)
    page.wait_for_function("() => document.getElementById('sweep-chart').data")
    assert (
        page.evaluate(TRACE_POINTS, ["sweep-chart", "probes"])
        == sweep.probes.filter(status="succeeded").count()
    )
    assert "✓" in page.inner_text("#probes")
    assert not page.js_errors, page.js_errors
    page.screenshot(path=str(screenshots / "sweep.png"), full_page=True)
