"""Pages that fit: no horizontal scroll at 1280 px and wider, and a usable layout on a 390 px phone
(every navigation link on screen), on the pages people use every day, with data in them; charts
whose text never runs into other text or out of the chart, with a dozen runs on them."""

from __future__ import annotations

import pytest

from apps.sweeps import probes as sweep_probes
from apps.sweeps import services as sweep_services
from tests.apps.dashboard.world import run_of, train
from tests.e2e.conftest import wait_for_charts
from tests.e2e.test_dashboard import demo_world, sign_in

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTHS = (1440, 1280, 390)
# JavaScript: the page's overflow, and what sticks out past the viewport (for the message).
OVERFLOW = """() => {
  const w = window.innerWidth, d = document.documentElement;
  const out = [...document.querySelectorAll('body *')].filter(el => {
    const r = el.getBoundingClientRect();
    return r.width && r.right > w + 1 && !el.closest('.js-plotly-plot .main-svg');
  }).slice(0, 6).map(el => (el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + el.className)
    + ' ' + Math.round(el.getBoundingClientRect().right));
  return {scroll: d.scrollWidth, inner: w, out};
}"""
# JavaScript: navigation links not shown whole inside the viewport.
NAV_HIDDEN = """() => [...document.querySelectorAll('.topbar nav a, .topbar .signout button')]
  .filter(a => {
    const r = a.getBoundingClientRect(), s = getComputedStyle(a);
    return !r.width || !r.height || s.visibility === 'hidden' || r.left < 0
      || r.right > window.innerWidth;
  }).map(a => a.textContent.trim())"""
# JavaScript: what is wrong with the charts' text. Per chart, text of one kind on text of another
# (title, axis titles, tick labels, annotations, Plotly legend entries: a legend over the x axis
# title, an axis title over the chart title), text out of the chart's box (a clipped axis title), a
# Plotly legend that scrolls; an HTML legend (legend.js) on a chart; the budget meter out of its
# cell.
CHART_TEXT = """() => {
  const KINDS = {title: '.gtitle', 'x title': '.xtitle', 'y title': '.ytitle',
    legend: '.legendtext', 'x tick': '.xtick text', 'y tick': '.ytick text',
    annotation: '.annotation-text'};
  const meet = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1
    && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
  const out = [], charts = [...document.querySelectorAll('.js-plotly-plot')];
  charts.forEach(chart => {
    const box = chart.getBoundingClientRect(), id = '#' + chart.id, texts = [];
    Object.entries(KINDS).forEach(([kind, sel]) => chart.querySelectorAll(sel).forEach(t => {
      const r = t.getBoundingClientRect(), text = t.textContent.trim();
      if (r.width && r.height && text) { texts.push({kind, r, text}); }
    }));
    const bars = [...chart.querySelectorAll('.legend .scrollbar')];
    if (bars.some(s => s.getBoundingClientRect().height)) { out.push(`${id}: its legend scrolls`); }
    texts.forEach((a, i) => {
      if (a.r.left < box.left - 1 || a.r.right > box.right + 1 || a.r.top < box.top - 1
          || a.r.bottom > box.bottom + 1) {
        out.push(`${id}: ${a.kind} "${a.text}" out of the chart`);
      }
      texts.slice(i + 1).filter(b => b.kind !== a.kind && meet(a.r, b.r))
        .forEach(b => out.push(`${id}: ${a.kind} "${a.text}" on ${b.kind} "${b.text}"`));
    });
  });
  document.querySelectorAll('.chart-legend:not([hidden])').forEach(legend => charts
    .filter(c => meet(legend.getBoundingClientRect(), c.getBoundingClientRect()))
    .forEach(c => out.push(`an HTML legend on #${c.id}`)));
  document.querySelectorAll('.budget-meter').forEach(m => {
    const r = m.getBoundingClientRect(), cell = m.closest('td').getBoundingClientRect();
    const table = m.closest('table').getBoundingClientRect();
    if (r.right > cell.right || cell.right > table.right + 1) {
      out.push('the budget meter overflows');
    }
  });
  return out;
}"""
# The pages whose charts CHART_TEXT reads.
CHARTED = ("experiment", "run", "spend")


@pytest.fixture
def pages(monkeypatch):
    """The demo experiment with a dozen runs (one training: the most its charts draw), and a sweep
    whose probes are still queued."""
    monkeypatch.setattr(sweep_probes, "probe_send", lambda **_: None)  # no worker: they wait
    seed, experiment, control, candidate, running = demo_world()
    arms = list(experiment.arms.order_by("name"))
    for i in range(7):  # the demo world's 5, and 7 short ones: 12 runs in every legend
        train(run_of(arms[i % len(arms)]), n=12)
    sweep = sweep_services.sweep_create(
        tenant=experiment.tenant,
        name="batch x seq_len",
        base_strategy_yaml="model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n",
        probe_count=4,
        probe_steps=4,
        parallelism=1,
        sampler="grid",
        space={"train.global_batch": [1, 2], "model.seq_len": [16, 32]},
    )
    paths = {
        "experiments": ("/", 0),
        "experiment": (f"/experiments/{experiment.pk}/", 6),
        "run": (f"/runs/{running.pk}/", 8),
        "runs": ("/runs/", 0),
        "pricing": ("/pricing/", 0),
        "spend": ("/spend/", 1),
        "sweeps": ("/sweeps/", 0),
        "sweep": (f"/sweeps/{sweep.pk}/", 0),
    }
    return seed, paths, sweep


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_window(page, live_server, pages, width, screenshots):
    seed, paths, _ = pages
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server, seed, "/")
    for name, (path, charts) in paths.items():
        page.goto(live_server.url + path)
        if charts:
            wait_for_charts(page, charts)
        if name == "sweep":
            page.wait_for_function("() => document.getElementById('sweep-chart').data")
        page.wait_for_timeout(100)  # responsive charts resize on the next frame
        fit = page.evaluate(OVERFLOW)
        assert fit["scroll"] <= fit["inner"], f"{name} at {width} px scrolls sideways: {fit}"
        if width < 600:
            assert page.evaluate(NAV_HIDDEN) == [], f"{name} at {width} px hides navigation"
        if name in CHARTED:
            assert page.evaluate(CHART_TEXT) == [], f"{name} at {width} px"
        if name in ("experiment", "run"):
            page.screenshot(path=str(screenshots / f"{name}-{width}.png"), full_page=True)
    assert not page.js_errors, page.js_errors


def test_the_comparison_shows_every_column_at_1440(page, live_server, pages):
    seed, paths, _ = pages
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, live_server, seed, paths["experiment"][0])
    box = page.locator("#comparison-measured th").last.bounding_box()
    assert "Deviation vs control" in page.locator("#comparison-measured th").last.inner_text()
    assert box["x"] + box["width"] <= 1440, box


def test_a_queued_sweep_says_so_instead_of_drawing_bare_axes(page, live_server, pages):
    seed, paths, sweep = pages
    sign_in(page, live_server, seed, paths["sweep"][0])
    page.wait_for_function("() => document.getElementById('sweep-chart').data")
    chart = page.evaluate(
        """() => { const l = document.getElementById('sweep-chart').layout;
        return {x: l.xaxis.visible, y: l.yaxis.visible,
                text: (l.annotations || []).map(a => a.text).join(' ')}; }"""
    )
    assert chart["x"] is False and chart["y"] is False, chart
    assert "no probe measured yet" in chart["text"], chart
    assert not page.js_errors, page.js_errors
