"""What each page says: numbers with units, estimated figures marked, empty states explained."""

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.attribution.models import AttributionWindow
from apps.attribution.say.report import experiment_report
from apps.attribution.services import arm_freeze, attribution_tick
from apps.dashboard.templatetags.dashboard_format import usd
from apps.experiments.models import Run
from tests.apps.dashboard.world import run_of, train
from tests.factories import ExperimentFactory, GpuPriceFactory

pytestmark = pytest.mark.django_db


def text(response) -> str:
    """The page as a person reads it: tags and the embedded chart data dropped, whitespace
    collapsed."""
    html = re.sub(
        r'<script id="dashboard-data".*?</script>', "", response.content.decode(), flags=re.S
    )
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def row(response, arm_id: int, table: str = "comparison-measured") -> str:
    html = response.content.decode()
    table_html = html[html.index(f'id="{table}"') :]
    start = table_html.index(f'data-arm="{arm_id}"')
    return re.sub(
        r"\s+", " ", re.sub(r"<[^>]+>", " ", table_html[start : table_html.index("</tr>", start)])
    )


def chart_data(response) -> dict:
    match = re.search(
        r'<script id="dashboard-data" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    return json.loads(match.group(1))


@pytest.fixture
def trained(w):
    """Two finished runs per arm; the control's energy modelled (estimated), the candidate's
    measured."""
    for arm, estimated in ((w.control, True), (w.candidate, False)):
        for _ in range(2):
            train(
                run_of(arm), n=60, estimated=estimated, power_w=300.0 if arm == w.control else 360.0
            )
    return w


def test_experiment_list_shows_state_arms_spend_attribution_and_frozen_arms(member, trained):
    w = trained
    page = text(member.get(reverse("dashboard:experiments")))
    spend = sum(r.cost_usd for r in Run.objects.filter(experiment=w.experiment))
    assert w.experiment.name in page and "Active" in page
    assert re.search(r"baseline control\s*,\s*optimized", page)
    assert f"{usd(spend)} est." in page, "spend includes modelled energy: marked"
    assert "not yet run" in page and "Frozen arms" in page

    attribution_tick(now=timezone.now())
    arm_freeze(arm_id=w.candidate.pk, reason="test", evidence={})
    page = text(member.get(reverse("dashboard:experiments")))
    assert "not yet run" not in page and "just now" in page  # never "0 minutes ago"
    assert re.search(r"just now\s+optimized", page), "the frozen arm is listed"


def test_experiment_list_empty_state(member, w):
    w.experiment.delete()
    assert "No experiments yet" in text(member.get(reverse("dashboard:experiments")))


def test_comparison_table_has_every_figure_with_its_unit(member, trained):
    w = trained
    response = member.get(reverse("dashboard:experiment", args=[w.experiment.pk]))
    assert response.status_code == 200
    report = {a.arm_id: a for a in experiment_report(experiment=w.experiment).arms}
    for arm in (w.control, w.candidate):
        cells = row(response, arm.pk)
        figures = report[arm.pk]
        assert arm.name in cells and "active" in cells
        assert usd(figures.total_usd) in cells and usd(figures.electricity_usd) in cells
        assert "none (CPU runs)" in cells, "CPU runs hold no GPU: said so, not '0 GPU·h'"
        assert "kWh" in cells and "USD/1M tok" in cells
        # gCO2e beside the dollars, with its band: modelled energy +-50 %, a counter's +-5-10 %
        band = {"modelled": "±50 %", "nvml": "±5 %", "rapl": "±10 %"}[figures.carbon["method"]]
        assert "gCO2e" in cells and band in cells and "gCO2e/1M tok" in cells
        assert re.search(r"\d+ min( \d+ s)?|\d+(\.\d+)? s", cells), "completion time with its unit"
        projected = row(response, arm.pk, "comparison-projected")
        assert f"≈ {usd(figures.projected.total_usd)}" in projected
    assert "est." in row(response, w.control.pk) and "est." not in row(response, w.candidate.pk)
    assert "control (0 %)" in row(response, w.control.pk)
    assert "%" in row(response, w.candidate.pk).split("USD/1M tok")[-1], "deviation vs control in %"


def test_without_target_steps_the_projection_says_how_to_get_one(member, trained):
    trained.experiment.target_steps = None
    trained.experiment.save()
    page = text(member.get(reverse("dashboard:experiment", args=[trained.experiment.pk])))
    assert "Set a target number of steps" in page


def test_empty_experiment_says_no_runs_yet_and_charts_are_empty(member, w):
    response = member.get(reverse("dashboard:experiment", args=[w.experiment.pk]))
    page = text(response)
    assert "No runs yet" in page and f"costlab submit --experiment {w.experiment.pk}" in page
    assert chart_data(response)["telemetry"]["series"] == {
        f: {} for f in ("util_pct", "power_w", "step_time_s", "micro_batch", "loss")
    }


def test_attribution_not_yet_run_then_the_timeline_fills(member, trained):
    w = trained
    url = reverse("dashboard:experiment", args=[w.experiment.pk])
    assert "Attribution not yet run" in text(member.get(url))
    attribution_tick(now=timezone.now())
    response = member.get(url)
    assert "Attribution not yet run" not in text(response)
    deviation = chart_data(response)["attribution"]["deviation"]
    assert list(deviation) == [str(w.candidate.pk)], "the control has no deviation line"
    assert len(deviation[str(w.candidate.pk)]["x"]) == 1


def test_a_skipped_attribution_says_why(member, trained):
    window = AttributionWindow.objects.create(
        experiment=trained.experiment,
        number=1,
        window_end=timezone.now(),
        status=AttributionWindow.Status.SKIPPED,
        skip_reason="pricing_table: no table in force",
    )
    page = text(member.get(reverse("dashboard:experiment", args=[trained.experiment.pk])))
    assert (
        f"Latest attribution (at {timezone.localtime(window.window_end):%H:%M}) was skipped" in page
        and "no table in force" in page
    )


def test_worker_offline_when_runs_wait_and_no_worker_reports(member, w):
    queued = run_of(w.control, status=Run.Status.QUEUED, started_at=None)
    Run.objects.filter(pk=queued.pk).update(queued_at=timezone.now() - timedelta(minutes=3))
    url = reverse("dashboard:experiment", args=[w.experiment.pk])
    page = text(member.get(url))
    assert "Worker offline" in page and "1 run(s) queued, the oldest for 3 min" in page
    run_page = text(member.get(reverse("dashboard:run", args=[queued.pk])))
    assert "Worker offline" in run_page
    assert "position 1 on the cpu queue" in run_page  # where it stands, said on its page
    # The page of a run behind others says how many wait on its queue (issue 25: "1 run(s)
    # queued, oldest 37 s" while about 10 were).
    later = [run_of(w.candidate, status=Run.Status.QUEUED, started_at=None) for _ in range(2)]
    behind = text(member.get(reverse("dashboard:run", args=[later[-1].pk])))
    assert "3 run(s) queued, the oldest for 3 min" in behind and "position 3" in behind

    run_of(w.candidate, status=Run.Status.RUNNING)  # a worker heartbeating now: busy, not offline
    page = text(member.get(url))
    assert "Worker offline" not in page and "Workers are busy" in page


def test_a_fresh_queue_is_not_an_alarm(member, w):
    run_of(w.control, status=Run.Status.QUEUED, started_at=None)
    page = text(member.get(reverse("dashboard:experiment", args=[w.experiment.pk])))
    assert "Worker offline" not in page and "Workers are busy" not in page


# What the worker stores on a run whose strategy said auto (workers.training._device_keys).
RESOLVED = {
    "precision.compute_dtype": {
        "requested": "auto",
        "resolved": "bf16",
        "why": "bf16 is native here and measured 4.18x fp32",
    },
    "optimizer.dynamic_batching.max_micro_batch": {
        "requested": "auto",
        "resolved": 1,
        "why": "bf16 GEMMs reach 90% of their best throughput at 256 rows (1 sequence of 256 "
        "tokens); a larger micro-batch buys under 10% here",
    },
    "kernels.compile": {"requested": "auto", "resolved": False, "why": "a CPU: it costs more"},
}


def test_run_page_and_api_say_how_kernels_compile_ended(member, w):
    """The payback rule's choice, and what the compile cost: loaded from the cache, here."""
    compiled = {
        "requested": "auto",
        "resolved": True,
        "why": "compiling pays: 99997 remaining steps x 0.5 s x (1 - 1/1.20) = 8333 s saved",
        "mode": "loaded",
        "cache": "hit",
        "compile_s": 4.2,
        "measured_speedup": 1.27,
        "estimated": False,
    }
    run = train(run_of(w.candidate, resolved={"kernels.compile": compiled}), n=3)
    page = text(member.get(reverse("dashboard:run", args=[run.pk])))
    assert (
        "kernels.compile auto true compiling pays: 99997 remaining steps x 0.5 s x (1 - 1/1.20) = "
        "8333 s saved loaded from the compile cache in 4.2 s; compiled steps measured 1.27x eager"
    ) in page
    down = {
        **compiled,
        "mode": "compiled",
        "cache": "miss",
        "compile_s": 48.0,
        "cache_where": "Redis unreachable (ConnectionError): compiled graphs are cached on this "
        "host only",
    }
    other = train(run_of(w.candidate, resolved={"kernels.compile": down}), n=3)
    assert (
        "compiled in 48.0 s (a cache miss); compiled steps measured 1.27x eager; Redis unreachable"
        " (ConnectionError): compiled graphs are cached on this host only"
    ) in text(member.get(reverse("dashboard:run", args=[other.pk])))
    answer = member.get(f"/api/v1/runs/{run.pk}/").json()
    assert answer["resolved"]["kernels.compile"]["cache"] == "hit"
    assert answer["resolved"]["kernels.compile"]["mode"] == "loaded"


def test_run_page_shows_config_provenance_and_cost_breakdown(member, w):
    run = train(
        run_of(
            w.candidate,
            git_sha="abc1234",
            host="gpu-7",
            device="cuda:0 NVIDIA H100",
            resolved=RESOLVED,
        ),
        n=30,
        estimated=True,
    )
    run_of(w.candidate, status=Run.Status.QUEUED)  # a later run not started: nothing resolved yet
    response = member.get(reverse("dashboard:run", args=[run.pk]))
    page = text(response)
    assert "abc1234" in page and "gpu-7" in page and "cuda:0 NVIDIA H100" in page
    assert "preset: tiny" in page
    # what each auto key became on this device, and why
    assert "Chosen on this device" in page
    for key, choice in RESOLVED.items():
        chosen = str(choice["resolved"]).lower()
        assert f"{key} auto {chosen} {choice['why']}" in page, key
    # the experiment page shows it beside the arm's strategy, from the arm's latest started run
    exp_page = text(member.get(reverse("dashboard:experiment", args=[w.experiment.pk])))
    assert (
        f"{w.candidate.name} — auto chose kernels.compile false, "
        f"optimizer.dynamic_batching.max_micro_batch 1, precision.compute_dtype bf16 on run "
        f"#{run.pk}"
    ) in exp_page
    assert f"Chosen on run #{run.pk}'s device" in exp_page
    assert exp_page.count("auto chose") == 1  # the control's runs resolved nothing
    breakdown = run.cost_breakdown
    for key in ("energy_usd", "cpu_usd", "memory_usd", "used_usd", "idle_usd", "total_usd"):
        assert usd(breakdown[key]) in page, key
    assert "kWh" in page and "est." in page
    data = chart_data(response)
    assert data["cost"]["energy_estimated"] is True
    assert set(data["telemetry"]["series"]) == {
        "util_pct",
        "power_w",
        "step_time_s",
        "micro_batch",
        "tokens_per_s",
        "loss",
    }
    assert len(data["telemetry"]["series"]["util_pct"][str(run.pk)]["x"]) == 30


def test_pricing_page_shows_the_table_in_force_and_labels_example_prices(member, w):
    table = w.experiment.tenant.pricing_tables.get()
    GpuPriceFactory(pricing_table=table)
    later = table.__class__.objects.create(
        tenant=table.tenant,
        name="Next quarter",
        valid_from=timezone.now() + timedelta(days=30),
        electricity_usd_per_kwh=1,
    )
    page = text(member.get(reverse("dashboard:pricing")))
    assert f"{table.name} example prices" in page and "Example prices: demo figures" in page
    assert (
        "The prices costs are" not in page
        and "The prices every run's cost is computed from" in page
    )
    table.notes = "Not a quote from any provider."
    table.save()
    warning = (
        text(member.get(reverse("dashboard:pricing")))
        .split("Example prices:")[1]
        .split("Electricity")[0]
    )
    assert warning.lower().count("not a quote from any provider") == 1, "the warning says it once"
    assert "USD/kWh" in page and "USD per GPU-hour" in page and "USD per vCPU-hour" in page
    assert f"{later.name}: from" in page and "upcoming" in page


def test_pricing_page_without_a_table_in_force(member, w):
    w.experiment.tenant.pricing_tables.update(valid_from=datetime(2099, 1, 1, tzinfo=UTC))
    assert "No pricing table in force" in text(member.get(reverse("dashboard:pricing")))


def test_names_are_escaped(member, w):
    ExperimentFactory(tenant=w.experiment.tenant, name='<script>alert("x")</script>')
    html = member.get(reverse("dashboard:experiments")).content.decode()
    assert '<script>alert("x")' not in html and "&lt;script&gt;alert" in html


def test_page_charts_stay_within_the_point_budget(member, w):
    from apps.dashboard.charts import budget_per_run
    from tests.apps.dashboard.test_series import stored

    runs = [stored(run_of(arm), 3000, priced=3000) for arm in (w.control, w.candidate)]
    data = chart_data(member.get(reverse("dashboard:experiment", args=[w.experiment.pk])))
    for field in ("util_pct", "power_w"):  # the fields stored() fills
        by_run = data["telemetry"]["series"][field]
        assert set(by_run) == {str(r.pk) for r in runs}, field
        for band in by_run.values():
            assert budget_per_run(2) // 2 < len(band["x"]) <= budget_per_run(2) < 3000, field


def test_outlier_runs_are_flagged_on_the_run_and_experiment_pages(member, w):
    from tests.apps.dashboard.world import run_of

    normal = [run_of(w.control, tokens=1000, device_seconds=s) for s in (10.0, 10.5, 9.5, 10.2)]
    slow = run_of(w.control, tokens=1000, device_seconds=85.0)
    page = member.get(f"/experiments/{w.experiment.pk}/").content.decode()
    assert page.count(">outlier</abbr>") == 1 and f"run {slow.pk}</a> <abbr" in page
    run_page = member.get(f"/runs/{slow.pk}/").content.decode()
    assert 'id="outlier"' in run_page and "MADs from its arm&#x27;s median" in run_page
    assert 'id="outlier"' not in member.get(f"/runs/{normal[0].pk}/").content.decode()
