"""Dashboard server time: the experiment page of a 1M-sample experiment vs a 1k-sample one.

Both experiments have 2 arms and 8 runs (4 per arm) and a long attribution history; the large
one holds 1,000,000 telemetry samples (125,000 per run), the small one 1,000. Each round GETs
both experiment pages (in a random order) through Django's test client, in one process, on
the same Postgres: server time, template rendering included. The ratio large/small says how
much the page slows down with 1000x the samples. Also reported: the first view of the large
page before beat rolled its samples up (a page view never writes: it reads the raw tail), the
beat rollup of the 1M samples into blocks, a live poll, and, without --quick, the same series
downsampled straight from the samples with apps.telemetry's samples_downsampled.

Then, in Chromium (Playwright, the system's browser), every page of the 1M-sample experiment as
served (gunicorn, 3 workers as in the Docker image, collected static files, DEBUG off): the
experiment list and page, each of its run pages, its runs list, a compare of 4 of its runs, its
edit and submit forms, and the spend page. Each navigation is cold (a fresh browser context: no
cache, plotly.js fetched and compiled again) and timed from navigation start to the load event;
then once more warm (same context: static files from the cache). browser_cold_s is the worst
page's median cold time.

The charts are drawn after the load event (dashboard/lazy.js: plotly.js is fetched and compiled
after it, then one chart per task, those in view first), so the load event no longer includes them;
browser_charts_s says when they are all there: the worst page's median cold time from navigation
start to the performance mark "costlab:charts-drawn" that lazy.js sets when its queue has drained
(every chart of the page drawn, off-screen ones included; a page without charts: its load event),
and browser_first_chart_s when the first one is ("costlab:first-chart": one in view). Until the
charts moved off the load event's path, both were the load event itself.

    python bench/dashboard.py [--quick] [--smoke] [--json]  (targets: page_s, browser_cold_s <= 1.0)

`--smoke`: 8,000 and 800 samples over 2 runs each (both run states, two run pages and a compare
of two), 20 attribution windows, two server rounds and one browser round (one gunicorn worker, one
warm-up request a page), on a database of its own
(`_dashboard_smoke`): the same code path and JSON keys in seconds, to check that the benchmark
runs (tests/bench); its figures mean nothing. It needs Chromium as the full run does
($COSTLAB_CHROMIUM or /usr/bin/chromium).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from _setup import django_on_postgres, spread

LARGE, SMALL = 1_000_000, 1_000
RUNS, WINDOWS = 8, 2_000
SMOKE = {"large": 8_000, "small": 800, "runs": 2, "windows": 20}  # --smoke's sizes


def build(
    name: str, samples_total: int, *, tenant, cost_model, runs: int = RUNS, windows: int = WINDOWS
):
    """An experiment with `runs` runs holding samples_total samples and `windows` attribution
    windows (in one transaction: a failed build leaves nothing half-made behind)."""
    from django.db import transaction

    with transaction.atomic():
        return _build(
            name, samples_total, tenant=tenant, cost_model=cost_model, runs=runs, windows=windows
        )


def _build(name: str, samples_total: int, *, tenant, cost_model, runs: int, windows: int):
    from django.db import connection

    from apps.attribution.models import (
        AttributionSnapshot,
        AttributionWindow,
        FreezeEvent,
        WeightChange,
    )
    from apps.experiments.models import Arm, Experiment, Run
    from apps.telemetry.models import TelemetrySample

    experiment = Experiment.objects.filter(tenant=tenant, name=name).first()
    if (
        experiment
        and experiment.runs.count() == runs
        and TelemetrySample.objects.filter(run__experiment=experiment).count() == samples_total
    ):
        return experiment  # kept from an earlier run of the same sizes
    if experiment:  # of other sizes: its runs first (a run protects its arm)
        Run.objects.filter(experiment=experiment).delete()
        experiment.delete()
    per_run = samples_total // runs
    t0 = datetime.now(UTC) - timedelta(seconds=per_run)
    experiment = Experiment.objects.create(
        tenant=tenant, name=name, cost_model=cost_model, status="active", target_steps=100_000
    )
    arms = [
        Arm.objects.create(
            experiment=experiment,
            name=n,
            is_control=i == 0,
            strategy_yaml="model: {family: llama, preset: tiny, seq_len: 64}\n",
        )
        for i, n in enumerate(("baseline", "optimized"))
    ]
    made = []
    for i in range(runs):
        arm = arms[i % 2]
        made.append(
            Run.objects.create(
                tenant=tenant,
                experiment=experiment,
                arm=arm,
                status="running" if i == 0 else "succeeded",
                config_yaml=arm.strategy_yaml,
                config_sha256=arm.strategy_sha256,
                attempts=1,
                vcpus=8,
                memory_gb=64,
                started_at=t0,
                finished_at=None if i == 0 else t0 + timedelta(seconds=per_run),
                heartbeat_at=t0,
                last_seq=per_run - 1,
                priced_seq=per_run - 1,
                steps=per_run,
                tokens=per_run * 4096,
                device_seconds=per_run,
                energy_j=per_run * 300.0,
                cost_usd=Decimal(per_run) / 1000 * (1 + i % 2) / 10,
            )
        )
    table = TelemetrySample._meta.db_table
    with connection.cursor() as cursor:
        for run in made:
            cursor.execute(
                f"INSERT INTO {table} (run_id, seq, attempt, ts, step, rank, device, util_pct, "
                "power_w, energy_j, step_time_s, tokens, tokens_per_s, micro_batch, loss, "
                "estimated) SELECT %s, g, 1, %s + g * interval '1 second', g, 0, 'cuda:0', 60 + "
                "35 * random(), 250 + 150 * random(), g * 300.0, 0.4 + 0.2 * random(), "
                "g::bigint * 4096, "
                "8000 + 500 * random(), 8 + (g / 5000) %% 8, 3.0 / (1 + g / 10000.0), false FROM "
                "generate_series(0, %s) g",
                [run.pk, t0, per_run - 1],
            )
        cursor.execute(f"ANALYZE {table}")
    step = timedelta(seconds=per_run / windows)
    windows = AttributionWindow.objects.bulk_create(
        [
            AttributionWindow(experiment=experiment, number=n + 1, window_end=t0 + step * (n + 1))
            for n in range(windows)
        ]
    )
    rng = random.Random(0)
    AttributionSnapshot.objects.bulk_create(
        [
            AttributionSnapshot(
                experiment=experiment,
                arm=arm,
                window=w,
                computed_at=w.window_end,
                window_end=w.window_end,
                weight=arm.weight,
                deviation=0.0 if arm.is_control else 0.03 + rng.gauss(0, 0.01),
                deviation_low=None if arm.is_control else 0.01,
                deviation_high=None if arm.is_control else 0.05,
            )
            for w in windows
            for arm in arms
        ],
        batch_size=2000,
    )
    WeightChange.objects.create(
        arm=arms[1], old_weight=1, new_weight=Decimal("0.9"), reason="bench: dynamic"
    )
    FreezeEvent.objects.create(
        experiment=experiment,
        arm=arms[1],
        action="freeze",
        reason="bench",
        deviation=0.06,
        threshold=0.05,
    )
    return experiment


LOAD_MS = """() => { const n = performance.getEntriesByType('navigation')[0];
  return n && n.loadEventEnd > 0 ? n.loadEventEnd - n.startTime : null; }"""
CHARTS_DRAWN = (
    "() => !window.costlabLazy || performance.getEntriesByName('costlab:charts-drawn').length > 0"
)
CHARTS_MS = (
    "(name) => { const m = performance.getEntriesByName(name)[0]; return m ? m.startTime : null; }"
)


def browser_pages(*, experiment, user, rounds: int, smoke: bool = False) -> dict[str, dict]:
    """Cold and warm navigation (start to load event, seconds) of each page, in Chromium, against a
    gunicorn serving the benchmark database with the collected static files."""
    import os
    import socket
    import subprocess
    import sys

    import httpx
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS

    runs = list(experiment.runs.order_by("pk").values_list("pk", flat=True))
    pk = experiment.pk
    pages = {
        "experiments": "/",
        "experiment": f"/experiments/{pk}/",
        **{f"run {i + 1}": f"/runs/{run}/" for i, run in enumerate(runs)},
        "runs list": f"/runs/?experiment={pk}",
        "compare 4 runs": "/runs/compare/?" + "&".join(f"run={r}" for r in runs[:4]),
        "edit form": f"/experiments/{pk}/edit/",
        "submit form": f"/experiments/{pk}/runs/new/",
        "spend": "/spend/",
    }
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DJANGO_DEBUG": "false",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}",
        "DJANGO_LOG_LEVEL": "ERROR",
    }
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi:application",
            "-b",
            f"127.0.0.1:{port}",
            "--workers",
            "1" if smoke else "3",  # --smoke: one worker to start and warm
        ],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/login/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = Client()
        client.force_login(user)
        cookie = {
            "name": settings.SESSION_COOKIE_NAME,
            "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
            "domain": "127.0.0.1",
            "path": "/",
        }
        times = {
            name: {
                f"{kind}{what}": []
                for kind in ("cold", "warm")
                for what in ("", " charts", " first chart")
            }
            for name in pages
        }
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
            )
            # Server warm-up: each gunicorn worker's first requests (imports, connection, templates)
            # are not what a browser's cold cache costs.
            with httpx.Client(cookies={cookie["name"]: cookie["value"]}) as http:
                for url in pages.values():
                    for _ in range(1 if smoke else 4):
                        assert http.get(base + url, timeout=30).status_code == 200, url
            for r in range(rounds):
                order = list(pages)
                random.Random(r).shuffle(order)
                for name in order:
                    context = browser.new_context(viewport={"width": 1400, "height": 1000})
                    context.add_cookies([cookie])
                    page = context.new_page()
                    for kind in ("cold", "warm"):
                        response = page.goto(base + pages[name], wait_until="load")
                        assert response.status == 200, (name, response.status)
                        page.wait_for_function(
                            "() => performance.getEntriesByType('navigation')[0].loadEventEnd > 0"
                        )
                        load = page.evaluate(LOAD_MS) / 1000
                        times[name][kind].append(load)
                        page.wait_for_function(CHARTS_DRAWN, timeout=60_000)
                        for what, mark in (
                            (" charts", "costlab:charts-drawn"),
                            (" first chart", "costlab:first-chart"),
                        ):
                            drawn = page.evaluate(CHARTS_MS, mark)
                            times[name][kind + what].append(
                                load if drawn is None else max(load, drawn / 1000)
                            )
                    context.close()
            browser.close()
    finally:
        os.killpg(web.pid, 9)
        web.wait()
    return {name: {kind: spread(values) for kind, values in t.items()} for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds, no samples_downsampled baseline"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: checks the code path only"
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    rounds = 2 if args.smoke else 5 if args.quick else 15
    sizes = (
        SMOKE if args.smoke else {"large": LARGE, "small": SMALL, "runs": RUNS, "windows": WINDOWS}
    )
    n_large, n_small = sizes["large"], sizes["small"]
    names = ("bench: smoke, large", "bench: smoke, small")
    if not args.smoke:
        names = ("bench: 1M samples", "bench: 1k samples")

    django_on_postgres(smoke=args.smoke)
    from django.conf import settings
    from django.test import Client

    from apps.core.staticfiles import static_collect_if_stale

    # Pages link the hashed, gzipped files, as make run and production serve them.
    static_collect_if_stale()

    from apps.dashboard import charts
    from apps.dashboard.models import SeriesBlock
    from apps.dashboard.services import series_blocks_roll_due
    from apps.demo.services import demo_seed
    from apps.experiments.models import Run
    from apps.telemetry.selectors import samples_downsampled

    settings.DEBUG = False  # as served: no query log, no debug templates
    seed = demo_seed(admin_username="bench-admin")
    cost_model = seed.experiment.cost_model
    t_build = time.perf_counter()
    shape = {"runs": sizes["runs"], "windows": sizes["windows"]}
    large = build(names[0], n_large, tenant=seed.tenant, cost_model=cost_model, **shape)
    small = build(names[1], n_small, tenant=seed.tenant, cost_model=cost_model, **shape)
    print(
        f"data ready in {time.perf_counter() - t_build:.1f} s: {n_large:,} and {n_small:,} "
        f"samples, {sizes['runs']} runs and {sizes['windows']} attribution windows each"
    )

    client = Client(SERVER_NAME="localhost")
    client.force_login(seed.tenant.memberships.first().user)

    def page(experiment) -> float:
        start = time.perf_counter()
        response = client.get(f"/experiments/{experiment.pk}/")
        elapsed = time.perf_counter() - start
        assert response.status_code == 200, response.status_code
        return elapsed

    SeriesBlock.objects.filter(run__experiment=large).delete()
    cold = page(large)  # before beat rolled anything up: blocks none, the raw tail only
    start = time.perf_counter()
    series_blocks_roll_due()  # what beat does (every COSTLAB_SERIES_ROLLUP_S), here all at once
    rollup = time.perf_counter() - start
    page(large)
    page(small)
    times = {"large": [], "small": []}
    ratios = []
    for r in range(rounds):
        order = ["large", "small"]
        random.Random(r).shuffle(order)
        got = {name: page(large if name == "large" else small) for name in order}
        for name, t in got.items():
            times[name].append(t)
        ratios.append(got["large"] / got["small"])

    since = int((datetime.now(UTC) - timedelta(seconds=5)).timestamp() * 1000)
    live = []
    for _ in range(rounds):
        start = time.perf_counter()
        assert client.get(f"/experiments/{large.pk}/live.json?since={since}").status_code == 200
        live.append(time.perf_counter() - start)

    # A run page of one run holding all n_large samples: its first view before beat rolled it up
    # (the raw tail only) and after (blocks, and the raw tail past them).
    one = build(
        names[0] + ", one run",
        n_large,
        tenant=seed.tenant,
        cost_model=cost_model,
        runs=1,
        windows=min(sizes["windows"], 20),
    )
    one_run = Run.objects.filter(experiment=one).get()
    SeriesBlock.objects.filter(run=one_run).delete()

    def run_page() -> float:
        start = time.perf_counter()
        response = client.get(f"/runs/{one_run.pk}/")
        elapsed = time.perf_counter() - start
        assert response.status_code == 200, response.status_code
        return elapsed

    run_cold = run_page()
    series_blocks_roll_due()
    run_rolled = run_page()
    run_after = spread([run_page() for _ in range(rounds)])

    naive = None
    if not args.quick:
        run_ids = list(Run.objects.filter(experiment=large).values_list("pk", flat=True))
        start = time.perf_counter()
        samples_downsampled(
            run_ids=run_ids,
            fields=list(charts.EXPERIMENT_FIELDS),
            budget=charts.budget_per_run(len(run_ids)),
        )
        naive = time.perf_counter() - start

    browser = browser_pages(
        experiment=large,
        user=seed.tenant.memberships.first().user,
        rounds=1 if args.smoke else 2 if args.quick else 5,
        smoke=args.smoke,
    )
    big, sm, rt, lv = spread(times["large"]), spread(times["small"]), spread(ratios), spread(live)
    print(f"{'experiment page (server time)':<40}{'median s':>10}{'min':>9}{'max':>9}{'IQR':>17}")
    for label, s in (
        (f"{n_large:,} samples", big),
        (f"{n_small:,} samples", sm),
        ("live poll, 1M experiment", lv),
    ):
        print(
            f"{label:<40}{s['median']:>10.3f}{s['min']:>9.3f}{s['max']:>9.3f}   "
            f"{s['q1']:.3f}-{s['q3']:.3f}"
        )
    print(f"{'first view of the 1M page (no blocks)':<40}{cold:>10.3f}")
    print(
        f"{'run page, one run of ' + format(n_large, ',') + ' samples':<40}{run_cold:>10.3f}   "
        f"first view before rollup; {run_rolled:.3f} s first after, {run_after['median']:.3f} s "
        f"median of {rounds} more; target <= 1.0 s"
    )
    print(f"{'beat rollup of the 1M samples':<40}{rollup:>10.3f}   (once, off the page's path)")
    if naive is not None:
        print(
            f"{'samples_downsampled, same series':<40}{naive:>10.3f}   (downsampling the raw "
            "samples per view)"
        )
    print(
        f"ratio 1M/1k page: {rt['median']:.2f} (IQR {rt['q1']:.2f}-{rt['q3']:.2f}, min "
        f"{rt['min']:.2f}, max {rt['max']:.2f}; {rounds} interleaved rounds); 1M page "
        f"{big['median']:.3f} s, target <= 1.0 s"
    )
    print(
        f"\n{'Chromium, navigation start to load event':<40}{'cold s':>10}{'max':>9}"
        f"{'warm s':>10}{'max':>9}"
        f"{'first chart, cold s':>21}{'all charts, cold s':>20}{'warm s':>10}"
    )
    for name, t in browser.items():
        print(
            f"{name:<40}{t['cold']['median']:>10.3f}{t['cold']['max']:>9.3f}"
            f"{t['warm']['median']:>10.3f}{t['warm']['max']:>9.3f}"
            f"{t['cold first chart']['median']:>21.3f}{t['cold charts']['median']:>20.3f}"
            f"{t['warm charts']['median']:>10.3f}"
        )
    worst = max(browser, key=lambda name: browser[name]["cold"]["median"])
    browser_cold = browser[worst]["cold"]["median"]
    print(
        f"browser_cold_s: {browser_cold:.3f} s ({worst}, median of "
        f"{browser[worst]['cold']['rounds']} cold navigations; worst single "
        f"{max(t['cold']['max'] for t in browser.values()):.3f} s), target <= 1.0 s"
    )
    worst_charts = max(browser, key=lambda name: browser[name]["cold charts"]["median"])
    browser_charts = browser[worst_charts]["cold charts"]["median"]
    print(
        f"browser_charts_s: {browser_charts:.3f} s ({worst_charts}: navigation start to every "
        f"chart drawn, cold; median of {browser[worst_charts]['cold charts']['rounds']})"
    )
    worst_first = max(browser, key=lambda name: browser[name]["cold first chart"]["median"])
    browser_first = browser[worst_first]["cold first chart"]["median"]
    print(
        f"browser_first_chart_s: {browser_first:.3f} s ({worst_first}: navigation start to its "
        "first chart drawn, cold)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "browser_cold_s": round(browser_cold, 3),
                    "browser_cold_page": worst,
                    "browser_cold_max_s": round(max(t["cold"]["max"] for t in browser.values()), 3),
                    "browser_warm_s": round(max(t["warm"]["median"] for t in browser.values()), 3),
                    "browser_charts_s": round(browser_charts, 3),
                    "browser_charts_page": worst_charts,
                    "browser_first_chart_s": round(browser_first, 3),
                    "browser_first_chart_page": worst_first,
                    "browser_charts_warm_s": round(
                        max(t["warm charts"]["median"] for t in browser.values()), 3
                    ),
                    "page_s": round(big["median"], 4),
                    "page_s_max": round(big["max"], 4),
                    "small_page_s": round(sm["median"], 4),
                    "ratio": round(rt["median"], 3),
                    "ratio_q1": round(rt["q1"], 3),
                    "ratio_q3": round(rt["q3"], 3),
                    "first_view_s": round(cold, 3),
                    "run_first_view_s": round(run_cold, 3),
                    "run_first_view_rolled_s": round(run_rolled, 3),
                    "run_page_s": round(run_after["median"], 4),
                    "rollup_s": round(rollup, 3),
                    "live_poll_s": round(lv["median"], 4),
                    "naive_downsample_s": None if naive is None else round(naive, 3),
                    "rounds": rounds,
                    "samples": n_large,
                }
            )
        )


if __name__ == "__main__":
    main()
