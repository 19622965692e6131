"""The dashboard in a real browser: sign in, the demo experiment's comparison and charts, a sample
arriving live, a freeze marker after a forced freeze; the run and pricing pages."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.attribution.services import arm_freeze, attribution_tick
from apps.billing.services import telemetry_ingest
from apps.demo.services import demo_seed
from apps.experiments.models import Run
from tests.apps.dashboard.world import run_of, samples, train
from tests.e2e.conftest import wait_for_charts

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# JavaScript: how many points each Plotly chart on the page draws.
CHART_POINTS = """() => Array.from(document.querySelectorAll('.chart')).map(el => ({
  id: el.id, points: (el.data || []).reduce((n, t) => n + (t.x ? t.x.length : 0), 0)}))"""
TRACE_POINTS = """([id, name]) => { const el = document.getElementById(id);
  const t = (el && el.data || []).find(t => t.name === name); return t ? t.x.length : 0; }"""
HAS_SAMPLE = """([x, y]) => { const el = document.getElementById('chart-util_pct');
  return (el && el.data || []).some(t => t.x && t.x.some((v, i) => v === x && t.y[i] === y)); }"""


@pytest.fixture
def demo():
    return demo_world()


def demo_world():
    """The demo experiment after a few minutes of training: two runs per arm done, each with three
    held-out evaluations, one training now, attributed twice (so the deviation timeline has a
    line)."""
    seed = demo_seed()
    experiment = seed.experiment
    control = experiment.arms.get(is_control=True)
    candidate = experiment.arms.get(name="costlab-optimized")  # the third arm stays unrun here
    now = timezone.now()
    done = [run_of(arm) for arm in (control, control, candidate, candidate)]
    for run in done:
        train(run, n=120, start=now - timedelta(minutes=8), estimated=run.arm_id == control.pk)
    attribution_tick(now=now - timedelta(seconds=70))
    for run in done:
        train(run, n=60, start=now - timedelta(minutes=6), estimated=run.arm_id == control.pk)
        evaluate(run, start=now - timedelta(minutes=8), at=(59, 119, 179))
    attribution_tick(now=now - timedelta(seconds=35))
    running = train(
        run_of(candidate, status=Run.Status.RUNNING), n=40, start=now - timedelta(seconds=45)
    )
    return seed, experiment, control, candidate, running


def evaluate(run: Run, *, start, at: tuple[int, ...]) -> None:
    """Held-out losses at these seqs, falling as training goes on, at their samples' time and
    tokens."""
    from apps.telemetry.models import RunEvaluation

    RunEvaluation.objects.bulk_create(
        RunEvaluation(
            run=run,
            seq=seq,
            ts=start + timedelta(seconds=seq),  # train() stamps seq n n seconds after start
            step=seq + 1,
            tokens=1024 * (seq + 1),
            metric="eval_loss",
            value=3.6 - 0.1 * i,
        )
        for i, seq in enumerate(at)
    )


def sign_in(page, live_server, seed, path: str) -> None:
    page.goto(live_server.url + path)
    assert "/login/" in page.url, "an anonymous visitor is sent to the login page"
    page.fill("#id_username", seed.admin_username)
    page.fill("#id_password", seed.admin_password)
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + path)


def test_experiment_page_live(page, live_server, demo, screenshots):
    seed, experiment, control, candidate, running = demo
    sign_in(page, live_server, seed, f"/experiments/{experiment.pk}/")
    assert page.locator(".admin-link").count() == 1, "the demo admin is staff: the admin link shows"

    # The comparison: every arm (the demo's third, unrun here, too), with numbers and units.
    rows = page.locator("#comparison-measured tbody tr")
    assert rows.count() == experiment.arms.count() == 3
    for arm in (control, candidate):
        row = page.locator(f'#comparison-measured tr[data-arm="{arm.pk}"]')
        assert arm.name in row.inner_text()
        total = row.locator('[data-col="total_usd"]').inner_text()
        assert "USD" in total and any(c.isdigit() and c != "0" for c in total), total
        assert "USD/1M tok" in row.locator('[data-col="usd_per_mtok"]').inner_text()
    assert (
        page.locator(f'#comparison-measured tr[data-arm="{control.pk}"] abbr.est').count() >= 1
    ), "the control's energy was modelled: marked estimated"
    assert page.locator(f'#comparison-measured tr[data-arm="{candidate.pk}"] abbr.est').count() == 0
    assert (
        "%"
        in page.locator(
            f'#comparison-measured tr[data-arm="{candidate.pk}"] [data-col="deviation"]'
        ).inner_text()
    )
    assert page.locator("#comparison-projected tbody tr").count() == 3

    # Every chart has data.
    wait_for_charts(page, 6)
    charts = page.evaluate(CHART_POINTS)
    assert {c["id"] for c in charts} >= {
        "chart-util_pct",
        "chart-power_w",
        "chart-step_time_s",
        "chart-micro_batch",
        "chart-deviation",
        "chart-weights",
        "chart-quality",
    }
    assert all(c["points"] > 0 for c in charts), charts
    page.wait_for_selector("#live-status.live")

    # A sample that lands while the page is open shows within 2 s.
    sample = samples(start=timezone.now(), first_seq=running.last_seq + 1, n=1, util=42.5)[0]
    telemetry_ingest(run_id=running.pk, samples=[sample], attempt=1)
    landed = time.monotonic()
    x = int(timezone.datetime.fromisoformat(sample["ts"]).timestamp() * 1000)
    page.wait_for_function(HAS_SAMPLE, arg=[x, 42.5], timeout=5000)
    assert time.monotonic() - landed <= 2.0, "a new sample must show within 2 s"

    # A forced freeze puts a marker on the deviation timeline, and the table says frozen.
    assert page.evaluate(TRACE_POINTS, ["chart-deviation", "freeze"]) == 0
    arm_freeze(arm_id=candidate.pk, reason="forced by the browser test", evidence={"test": True})
    page.wait_for_function(
        f"() => ({TRACE_POINTS})(['chart-deviation', 'freeze']) === 1", timeout=5000
    )
    page.wait_for_function(
        "() => (document.querySelector('#comparison-measured "
        f"""tr[data-arm="{candidate.pk}"] [data-col="state"]')\n"""
        "                  || {}).innerText === 'frozen'",
        timeout=5000,
    )

    page.screenshot(path=str(screenshots / "experiment.png"), full_page=True)
    assert not page.js_errors, page.js_errors


def test_a_sample_that_lands_before_the_charts_are_drawn_is_drawn_with_them(
    page, live_server, demo
):
    """The charts are drawn after the load event, once plotly.js is there (dashboard/lazy.js); the
    live poll runs from the start. Here plotly.js is held back: the page is usable, polls, and
    keeps what arrives for the charts, which draw it when plotly.js comes."""
    seed, experiment, control, candidate, running = demo
    held, released = (
        [],
        [],
    )  # plotly.js's requests (the page's prefetch, lazy.js's script), held until released

    def hold(route):
        if released:
            route.continue_()
        else:
            held.append(route)

    page.route("**/plotly-basic*.js", hold)
    sign_in(page, live_server, seed, f"/experiments/{experiment.pk}/")
    assert (
        page.locator("#verdict-card").is_visible()
        and page.locator("#comparison-measured").is_visible()
    )
    page.wait_for_selector("#live-status.live")
    sample = samples(start=timezone.now(), first_seq=running.last_seq + 1, n=1, util=42.5)[0]
    telemetry_ingest(run_id=running.pk, samples=[sample], attempt=1)
    ts = timezone.datetime.fromisoformat(sample["ts"])
    page.wait_for_function(
        f"() => document.getElementById('live-status').textContent"
        f".includes('last sample {ts:%H:%M:%S}')",
        timeout=5000,
    )
    assert page.evaluate(
        "() => [window.Plotly, document.getElementById('chart-util_pct').data]"
    ) == [None, None]
    page.wait_for_timeout(
        300
    )  # lazy.js asks for plotly.js after the load event: that request is held too
    assert page.evaluate("() => window.Plotly") is None
    released.append(True)
    for route in held:
        route.continue_()
    wait_for_charts(page, 6)
    page.wait_for_function(HAS_SAMPLE, arg=[int(ts.timestamp() * 1000), 42.5], timeout=5000)
    assert not page.js_errors, page.js_errors


def test_run_and_pricing_pages(page, live_server, demo, screenshots):
    seed, experiment, control, candidate, running = demo
    sign_in(page, live_server, seed, f"/runs/{running.pk}/")
    assert running.config_yaml.splitlines()[0] in page.locator("pre.yaml").inner_text()
    assert "USD" in page.locator("#cost-breakdown").inner_text()
    wait_for_charts(page, 8)
    charts = page.evaluate(CHART_POINTS)
    assert len(charts) == 8 and all(c["points"] > 0 for c in charts), charts
    page.screenshot(path=str(screenshots / "run.png"), full_page=True)

    page.click("text=Pricing")
    assert "example prices" in page.locator("h2").first.inner_text()
    assert page.locator("#gpu-prices tbody tr").count() == 4
    page.screenshot(path=str(screenshots / "pricing.png"), full_page=True)

    page.click("text=Experiments")
    listed = page.locator(f'#experiments tr[data-experiment="{experiment.pk}"]').inner_text()
    assert experiment.name in listed and "USD" in listed
    assert "ago" in listed or "just now" in listed  # when it was last attributed
    page.screenshot(path=str(screenshots / "experiments.png"), full_page=True)
    assert not page.js_errors, page.js_errors
