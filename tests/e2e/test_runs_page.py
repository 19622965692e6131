"""The runs page in a real browser: filter, sort, the CSV download, compare two runs with overlaid
charts, and the spend page's chart against the budget."""

from __future__ import annotations

import csv
import io

import pytest

from apps.experiments.models import Run
from tests.apps.dashboard.world import PASSWORD, run_of, train, world
from tests.e2e.conftest import wait_for_charts

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_filter_sort_csv_compare_and_spend(page, live_server, screenshots):
    w = world()
    done = [
        train(run_of(arm, git_sha=sha), n=30)
        for arm, sha in ((w.control, "aaa111"), (w.candidate, "bbb222"), (w.candidate, "bbb333"))
    ]
    failed = run_of(w.control, status=Run.Status.FAILED, git_sha="ccc444")
    page.goto(live_server.url + "/runs/")
    page.fill("#id_username", w.user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/runs/")
    assert page.locator("#run-table tbody tr").count() == 4

    # Filter: one arm's succeeded runs, then a commit prefix.
    page.select_option("#id_arm", str(w.candidate.pk))
    page.select_option("#id_status", "succeeded")
    page.click("#apply-filters")
    page.wait_for_load_state()
    shown = page.locator("#run-table tbody tr").evaluate_all(
        "rows => rows.map(r => +r.dataset.run)"
    )
    assert sorted(shown) == sorted([done[1].pk, done[2].pk])
    page.fill("#id_git_sha", "bbb3")
    page.click("#apply-filters")
    page.wait_for_load_state()
    assert page.locator("#run-table tbody tr").evaluate_all(
        "rows => rows.map(r => +r.dataset.run)"
    ) == [done[2].pk]

    # The CSV is what the page shows.
    with page.expect_download() as download:
        page.click("#runs-csv")
    rows = list(csv.DictReader(io.StringIO(open(download.value.path(), encoding="utf-8").read())))
    assert [int(r["run_id"]) for r in rows] == [done[2].pk] and rows[0]["git_sha"] == "bbb333"

    # Sort by cost over everything, then compare the two dearest succeeded runs.
    page.click("text=Clear")
    page.click('a[data-sort="cost"]')
    page.wait_for_load_state()
    assert "sort=-cost" in page.url
    assert page.locator(f'#run-table tr[data-run="{failed.pk}"]').count() == 1
    page.check(f'input[name=run][value="{done[0].pk}"]')
    page.check(f'input[name=run][value="{done[1].pk}"]')
    page.click("#compare-runs")
    page.wait_for_url("**/runs/compare/**")
    wait_for_charts(page, 4, "#dashboard")
    traces = page.evaluate(
        "() => document.getElementById('chart-util_pct').data.filter(t => t.x && t.x.length).length"
    )
    assert traces >= 2, "both runs overlaid"
    assert page.locator("#compare-cost tr[data-term=total] td").count() == 2
    page.screenshot(path=str(screenshots / "runs-compare.png"), full_page=True)

    # Spend: this month's cumulative spend per arm against the budget, with the quota.
    page.click("nav >> text=Spend")
    page.wait_for_function("() => document.querySelectorAll('.spend-chart .main-svg').length >= 1")
    assert "of 4" in page.locator('[data-col="quota"]').inner_text()
    names = page.evaluate("() => document.querySelector('.spend-chart').data.map(t => t.name)")
    assert any(n.endswith("/ optimized") for n in names)
    assert "above this scale" in page.locator(".spend-chart").inner_text(), (
        "a budget 1000x the spend is said, not drawn"
    )
    page.screenshot(path=str(screenshots / "spend.png"), full_page=True)
    assert not page.js_errors, page.js_errors
