"""The charts in Chromium: a gap in a run is a break, runs of one arm get distinct shades of its
colour, a click on a run in the legend isolates it on every chart, CPU runs are labelled as such,
the x axis reads time, time since start, steps or tokens, and empty charts say so."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.apps.dashboard.world import PASSWORD, run_of, train, world
from tests.e2e.conftest import wait_for_charts

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TRACES = """(id) => (document.getElementById(id).data || []).filter(t => t.showlegend !== false)
  .map(t => ({name: t.name, color: t.line.color, nulls: t.y.filter(v => v === null).length,
              visible: t.visible === undefined ? true : t.visible}))"""
LAYOUT = (
    "(id) => { const l = document.getElementById(id).layout;\n"
    "  return {title: l.title.text, x: l.xaxis.visible, "
    "text: (l.annotations || []).map(a => a.text)}; }"
)


@pytest.fixture
def lab():
    w = world(username="charts")
    w.user.set_password(PASSWORD)
    w.user.save()
    now = timezone.now()
    gapped = train(run_of(w.control), n=20, start=now - timedelta(minutes=6))
    train(
        gapped, n=20, start=now - timedelta(minutes=2)
    )  # a retried run: three minutes without a sample
    plain = [train(run_of(w.control), n=20, start=now - timedelta(minutes=5)) for _ in range(2)]
    other = train(run_of(w.candidate), n=20, start=now - timedelta(minutes=5))
    empty = world(username="empty")
    empty.user.set_password(PASSWORD)
    empty.user.save()
    return w, gapped, plain, other, empty


def sign_in(page, base, username, path):
    page.goto(base + path)
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base + path)


def test_breaks_shades_isolation_labels(page, live_server, lab):
    w, gapped, plain, other, _ = lab
    sign_in(page, live_server.url, w.user.username, f"/experiments/{w.experiment.pk}/")
    wait_for_charts(page, 6)
    traces = {t["name"]: t for t in page.evaluate(TRACES, "chart-util_pct")}
    label = {
        r.pk: next(n for n in traces if n.startswith(f"run {r.pk} "))
        for r in (gapped, *plain, other)
    }
    assert traces[label[gapped.pk]]["nulls"] >= 1, "the gap is a break in the line"
    assert all(traces[label[r.pk]]["nulls"] == 0 for r in plain), "no break without a gap"
    control_colors = {traces[label[r.pk]]["color"] for r in (gapped, *plain)}
    assert len(control_colors) == 3, ("three runs of one arm, three shades", control_colors)
    assert traces[label[other.pk]]["color"] not in control_colors
    assert page.evaluate(LAYOUT, "chart-util_pct")["title"] == "CPU utilization", (
        "CPU runs: CPU utilization"
    )

    # A click on a run in the telemetry legend leaves that run alone on every chart; another click
    # brings the others back.
    entry = page.locator("#telemetry-legend .legend-entry", has_text=f"run {other.pk} ")
    entry.click()
    alone = """([ids, run]) => ids.every(id => (document.getElementById(id).data || [])
        .filter(t => t.showlegend !== false && t.visible !== 'legendonly').map(t => t.name)
        .every(n => n.startsWith(`run ${run} `)))"""
    page.wait_for_function(alone, arg=[["chart-util_pct", "chart-power_w"], other.pk])
    entry.click()
    page.wait_for_function("""() => (document.getElementById('chart-power_w').data || [])
        .filter(t => t.showlegend !== false && t.visible !== 'legendonly').length === 4""")

    page.goto(f"{live_server.url}/runs/{gapped.pk}/")
    page.wait_for_selector("#cost-breakdown")
    assert "Device-hours (CPU)" in page.locator("#cost-breakdown").inner_text()
    assert not page.js_errors, page.js_errors


def test_empty_charts_say_so(page, live_server, lab):
    *_, empty = lab
    sign_in(page, live_server.url, empty.user.username, f"/experiments/{empty.experiment.pk}/")
    wait_for_charts(page, 6)
    empty = ("no telemetry yet", "no attribution window yet", "No held-out evaluations yet")
    for chart in ("chart-util_pct", "chart-power_w", "chart-deviation", "chart-quality"):
        layout = page.evaluate(LAYOUT, chart)
        assert layout["x"] is False, (chart, "no 2000 axis on an empty chart")
        assert any(e in t for e in empty for t in layout["text"]), layout
    ticks = page.evaluate(
        "() => Array.from(document.querySelectorAll('#chart-util_pct .xtick text'))"
        ".map(t => t.textContent)"
    )
    assert not any("2000" in t for t in ticks), ticks
    assert not page.js_errors, page.js_errors


def test_recent_runs_and_counts_follow_the_runs_without_a_reload(page, live_server, lab):
    """A run that starts training shows in "Recent runs" and the header counts within seconds, and
    again when it ends (it used to stay missing a minute later while the charts already drew it)."""
    from apps.experiments.models import Run

    w, *_ = lab
    sign_in(page, live_server.url, w.user.username, f"/experiments/{w.experiment.pk}/")
    page.wait_for_selector("#live-status")
    assert "running" not in page.locator("#facts").inner_text()
    run = train(
        run_of(w.candidate, status=Run.Status.RUNNING),
        n=5,
        start=timezone.now() - timedelta(seconds=5),
    )
    page.wait_for_selector(f'#runs-fragment tr[data-run="{run.pk}"]', timeout=8000)
    page.wait_for_function(
        "() => document.getElementById('facts').innerText.includes('1 running')", timeout=8000
    )
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, finished_at=timezone.now())
    page.wait_for_function(
        f"""() => (document.querySelector('#runs-fragment tr[data-run="{run.pk}"]') || {{}})
        .innerText.includes('Succeeded')""",
        timeout=8000,
    )
    assert "running" not in page.locator("#facts").inner_text()
    assert not page.js_errors, page.js_errors


def test_x_axis_toggle_lays_runs_over_each_other(page, live_server, lab):
    """'since run start': each run's x is seconds from its first sample, so runs started minutes
    apart overlap; 'step' and 'tokens': where each run was; 'time (UTC)' brings the time of day
    back."""
    w, gapped, plain, other, _ = lab
    sign_in(page, live_server.url, w.user.username, f"/experiments/{w.experiment.pk}/")
    wait_for_charts(page, 6)
    first_x = """() => (document.getElementById('chart-step_time_s').data || [])
        .filter(t => t.showlegend !== false).map(t => [t.name, t.x[0]])"""
    before = dict(page.evaluate(first_x))
    assert all(x > 1e12 for x in before.values()), "time of day: epoch ms"
    page.click('[data-xaxis="elapsed"]')
    page.wait_for_function(
        "() => document.getElementById('chart-step_time_s').layout.xaxis.type === 'linear'"
    )
    after = dict(page.evaluate(first_x))
    assert all(x == 0 for x in after.values()), ("every run starts at 0 s", after)
    assert "since the run started" in page.evaluate(
        "() => document.getElementById('chart-util_pct').layout.xaxis.title.text"
    )
    # Steps and tokens: where each run was at each point (the world's samples: step seq + 1, 1,024
    # tokens a step), the gapped run's second attempt carrying on from its first.
    ends = """() => Object.fromEntries((document.getElementById('chart-loss').data || [])
        .filter(t => t.showlegend !== false)
        .map(t => [t.name.split(' ')[1], [t.x[0], t.x.filter(v => v !== null).pop()]]))"""
    expected = {str(r.pk): 20 for r in (*plain, other)} | {str(gapped.pk): 40}
    for mode, title, per_step in (("step", "step", 1), ("tokens", "tokens trained", 1024)):
        page.click(f'[data-xaxis="{mode}"]')
        page.wait_for_function(
            f"() => document.getElementById('chart-loss').layout.xaxis.title.text === '{title}'"
        )
        assert page.evaluate(ends) == {
            run: [per_step, last * per_step] for run, last in expected.items()
        }, mode
    page.click('[data-xaxis="time"]')
    page.wait_for_function(
        "() => document.getElementById('chart-step_time_s').layout.xaxis.type === 'date'"
    )
    assert dict(page.evaluate(first_x)) == before
    assert not page.js_errors, page.js_errors
