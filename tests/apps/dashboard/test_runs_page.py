"""The runs page and its selectors: every run of the user's teams, filtered, sorted, paginated in a
fixed number of queries; CSV of the runs and of an experiment's comparison; compare 2-4 runs; spend
against the monthly budget."""

import csv
import io
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.dashboard import runs as selectors
from apps.experiments.models import Run
from tests.apps.dashboard.world import run_of, train, world
from tests.factories import ArmFactory

pytestmark = pytest.mark.django_db


def queued(run: Run, when: datetime, **fields) -> Run:
    Run.objects.filter(pk=run.pk).update(queued_at=when, **fields)
    run.refresh_from_db()
    return run


@pytest.fixture
def runs(w):
    """Five runs of the member's team over three days, and one of another team's."""
    now = timezone.now()
    r = {
        "a": queued(
            run_of(w.control),
            now - timedelta(days=2),
            git_sha="abc1230000",
            cost_usd=Decimal("1.5"),
        ),
        "b": queued(
            run_of(w.control, status=Run.Status.FAILED), now - timedelta(days=1), git_sha="abd9"
        ),
        "c": queued(
            run_of(w.candidate), now - timedelta(days=1), git_sha="abc99", cost_usd=Decimal("0.2")
        ),
        "d": queued(run_of(w.candidate, status=Run.Status.QUEUED), now),
        "e": queued(run_of(w.candidate, status=Run.Status.RUNNING), now, cost_usd=Decimal("3")),
    }
    r["other"] = run_of(world().control)
    return r


def ids(queryset) -> list[int]:
    return list(queryset.values_list("pk", flat=True))


def test_runs_filtered_scopes_and_filters(w, runs):
    user = w.user
    everything = ids(selectors.runs_filtered(user=user))
    assert set(everything) == {runs[k].pk for k in "abcde"}, "another team's run is never listed"
    assert everything[:2] == sorted([runs["d"].pk, runs["e"].pk], reverse=True), (
        "newest first, then by id"
    )
    assert set(ids(selectors.runs_filtered(user=user, arm=w.control))) == {
        runs["a"].pk,
        runs["b"].pk,
    }
    assert ids(selectors.runs_filtered(user=user, status="failed")) == [runs["b"].pk]
    assert set(ids(selectors.runs_filtered(user=user, git_sha="ABC"))) == {
        runs["a"].pk,
        runs["c"].pk,
    }, "a prefix, any case"
    today = timezone.now().date()
    assert set(ids(selectors.runs_filtered(user=user, since=today))) == {runs["d"].pk, runs["e"].pk}
    yesterday = today - timedelta(days=1)
    assert set(ids(selectors.runs_filtered(user=user, since=yesterday, until=yesterday))) == {
        runs["b"].pk,
        runs["c"].pk,
    }
    assert ids(selectors.runs_filtered(user=user, experiment=w.experiment, sort="-cost"))[:3] == [
        runs["e"].pk,
        runs["a"].pk,
        runs["c"].pk,
    ]
    assert ids(selectors.runs_filtered(user=user, sort="cost"))[-1] == runs["e"].pk


def test_unfinished_runs_sort_last_both_ways(w, runs):
    for sort in ("finished", "-finished"):
        listed = ids(selectors.runs_filtered(user=w.user, sort=sort))
        assert set(listed[-2:]) == {runs["d"].pk, runs["e"].pk}, sort


def test_the_page_filters_sorts_and_names_a_bad_filter(member, w, runs):
    response = member.get(reverse("dashboard:runs"), {"arm": w.control.pk, "sort": "cost"})
    assert response.status_code == 200
    assert [r.pk for r, _ in response.context["runs"]] == [runs["b"].pk, runs["a"].pk]
    body = response.content.decode()
    assert f'data-run="{runs["other"].pk}"' not in body
    response = member.get(reverse("dashboard:runs"), {"git_sha": "xyz!", "since": "2026-13-01"})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert (
        errors["git_sha"] == ["git_sha: hexadecimal, a prefix of the commit"] and "since" in errors
    )
    other_arm = Run.objects.get(pk=runs["other"].pk).arm_id
    assert member.get(reverse("dashboard:runs"), {"arm": other_arm}).status_code == 400, (
        "another team's arm is not a choice"
    )


def test_pages_of_fifty(member, w, runs):
    for _ in range(52):
        run_of(w.control)
    first = member.get(reverse("dashboard:runs"))
    assert len(first.context["runs"]) == 50 and first.context["page"].paginator.count == 57
    second = member.get(reverse("dashboard:runs"), {"page": 2})
    assert len(second.context["runs"]) == 7
    assert not {r.pk for r, _ in first.context["runs"]} & {r.pk for r, _ in second.context["runs"]}


@pytest.mark.parametrize("extra_runs", [0, 40], ids=["small", "large"])
def test_the_runs_page_costs_a_fixed_number_of_queries(
    member, w, extra_runs, django_assert_max_num_queries
):
    arms = [ArmFactory(experiment=w.experiment) for _ in range(extra_runs // 10)]
    for i in range(extra_runs):
        run_of(arms[i % len(arms)], git_sha="abc")
    # session, user, experiments and arms of the filter form, the count, the page
    with django_assert_max_num_queries(7):
        assert member.get(reverse("dashboard:runs"), {"git_sha": "abc"}).status_code == 200
    with django_assert_max_num_queries(6):
        assert member.get(reverse("dashboard:runs-csv")).status_code == 200


def read_csv(response) -> list[dict]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


def test_runs_csv_follows_the_filters(member, w, runs):
    response = member.get(
        reverse("dashboard:runs-csv"), {"experiment": w.experiment.pk, "status": "succeeded"}
    )
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = read_csv(response)
    assert {int(r["run_id"]) for r in rows} == {runs["a"].pk, runs["c"].pk}
    a = next(r for r in rows if int(r["run_id"]) == runs["a"].pk)
    assert (a["arm"], a["git_sha"], a["cost_usd"]) == ("baseline", "abc1230000", "1.500000")
    assert a["g_co2e"] == "0.000" and a["carbon_method"] in ("nvml", "rapl")
    assert member.get(reverse("dashboard:runs-csv"), {"status": "bogus"}).status_code == 400


def test_experiment_comparison_csv_has_a_row_per_arm(member, w):
    train(run_of(w.control), n=20)
    train(run_of(w.candidate), n=20)
    response = member.get(reverse("dashboard:experiment-comparison-csv", args=[w.experiment.pk]))
    rows = read_csv(response)
    assert [r["name"] for r in rows] == ["baseline", "optimized"]
    assert float(rows[0]["total_usd"]) > 0 and float(rows[0]["usd_per_mtok"]) > 0
    assert rows[0]["deviation"] == "" or float(rows[0]["deviation"]) == 0.0
    assert float(rows[0]["projected.total_usd"]) > 0 and rows[0]["projected.estimated"] == "True", (
        "the projection is columns of its own, flagged estimated"
    )
    # gCO2e beside the dollars, with how its energy was measured and the band that follows.
    assert float(rows[0]["carbon.g_co2e"]) > 0 and rows[0]["carbon.method"] in ("nvml", "rapl")
    assert float(rows[0]["carbon.low"]) < float(rows[0]["carbon.g_co2e"])
    assert float(rows[0]["gco2e_per_mtok"]) > 0 and "carbon_deviation" in rows[0]
    assert (
        member.get(
            reverse("dashboard:experiment-comparison-csv", args=[world().experiment.pk])
        ).status_code
        == 404
    )


def test_compare_two_runs_config_diff_first_and_costs(member, w):
    w.candidate.strategy_yaml = w.control.strategy_yaml + "precision: {compute_dtype: bf16}\n"
    w.candidate.save()
    a, b = train(run_of(w.control), n=10), train(run_of(w.candidate), n=10)
    response = member.get(reverse("dashboard:runs-compare"), {"run": [a.pk, b.pk]})
    assert response.status_code == 200
    config = response.context["config"]
    assert config[0].key == "precision.compute_dtype" and config[0].values == ["fp32", "bf16"]
    assert all(not row.differs for row in config[1:])
    costs = dict(response.context["costs"])
    assert costs["total"] == [a.cost_usd, b.cost_usd] and "per 1M tokens" in costs
    assert set(response.context["charts"]["telemetry"]["runs"]) == {str(a.pk), str(b.pk)}


def test_compare_refuses_one_run_five_runs_and_other_teams(member, w):
    mine = [run_of(w.control) for _ in range(5)]
    for chosen in (mine[:1], mine):
        response = member.get(reverse("dashboard:runs-compare"), {"run": [r.pk for r in chosen]})
        assert response.status_code == 400 and "2 to 4" in response.context["error"]
    other = run_of(world().control)
    response = member.get(reverse("dashboard:runs-compare"), {"run": [mine[0].pk, other.pk]})
    assert response.status_code == 400 and "not your team" in response.context["error"]


def test_spend_per_arm_this_month_against_the_budget(member, w):
    tenant = w.experiment.tenant
    tenant.monthly_budget_usd = Decimal("10")
    tenant.save()
    start = datetime(2026, 3, 1, tzinfo=UTC)
    queued(run_of(w.control), start + timedelta(days=2), cost_usd=Decimal("2"))
    queued(run_of(w.control), start + timedelta(days=5), cost_usd=Decimal("1"))
    queued(run_of(w.candidate), start + timedelta(days=5), cost_usd=Decimal("4"))
    queued(run_of(w.candidate), start - timedelta(days=1), cost_usd=Decimal("100"))  # February
    queued(
        run_of(world().control), start + timedelta(days=3), cost_usd=Decimal("50")
    )  # another team
    overview = selectors.spend_overview(user=w.user, month=date(2026, 3, 17))
    [spend] = overview["tenants"]
    assert spend.spent_usd == Decimal("7") and spend.budget_usd == Decimal("10")
    assert spend.budget_share == pytest.approx(0.7)
    assert [(r["arm__name"], r["runs"], r["cost_usd"]) for r in spend.by_arm] == [
        ("baseline", 2, Decimal("3")),
        ("optimized", 1, Decimal("4")),
    ]
    chart = overview["chart"][str(tenant.pk)]
    baseline = next(t for t in chart["traces"] if t["name"].endswith("/ baseline"))
    assert (
        len(baseline["x"]) == 31
        and baseline["y"][1] == 0
        and baseline["y"][2] == 2
        and baseline["y"][-1] == 3
    )
    assert chart["budget_usd"] == 10.0
    page = member.get(reverse("dashboard:spend"), {"month": "2026-03"})
    assert page.status_code == 200 and "70 %" in page.content.decode()
    assert member.get(reverse("dashboard:spend"), {"month": "March"}).status_code == 400


def test_every_column_header_sorts_and_a_bad_sort_is_named(member, w, runs):
    page = member.get(reverse("dashboard:runs")).content.decode()
    headers = set(re.findall(r'data-sort="(\w+)"', page))
    assert headers == set(selectors.SORTS), "a header per sortable column"
    for key in selectors.SORTS:
        for sort in (key, f"-{key}"):
            response = member.get(reverse("dashboard:runs"), {"sort": sort})
            assert response.status_code == 200, sort
            assert len(response.context["runs"]) == 5
    response = member.get(reverse("dashboard:runs"), {"sort": "-password"})
    assert response.status_code == 400
    assert response.context["form"].errors["sort"][0].startswith("sort: one of queued, cost")


def test_the_new_pages_need_a_signed_in_user(client, w):
    run = run_of(w.control, status=Run.Status.QUEUED)
    gets = [
        reverse("dashboard:runs"),
        reverse("dashboard:runs-csv"),
        reverse("dashboard:runs-compare"),
        reverse("dashboard:spend"),
        reverse("dashboard:experiment-new"),
        reverse("dashboard:sweep-new"),
        reverse("dashboard:experiment-edit", args=[w.experiment.pk]),
        reverse("dashboard:runs-new", args=[w.experiment.pk]),
        reverse("dashboard:experiment-comparison-csv", args=[w.experiment.pk]),
    ]
    for url in gets:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(
            reverse("dashboard:login")
        ), url
    response = client.post(reverse("dashboard:run-cancel", args=[run.pk]))
    assert response.status_code == 302 and response["Location"].startswith(
        reverse("dashboard:login")
    )
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_runs_are_found_by_name_tag_note_commit_and_strategy_key(member, w):
    from apps.experiments.services import run_annotate

    a = run_of(w.control, git_sha="abc1234", run_key="nightly-1")
    b = run_of(w.candidate, git_sha="def5678")
    run_annotate(run=a, tags="nightly,pr-7", note="after the tokenizer change")
    run_annotate(run=b, tags="pr-70")

    def shown(q: str) -> set[int]:
        html = member.get(reverse("dashboard:runs"), {"q": q}).content.decode()
        return {int(x) for x in re.findall(r'<tr data-run="(\d+)"', html)}

    assert shown("nightly-1") == {a.pk} and shown("pr-7") == {a.pk} and shown("pr-70") == {b.pk}
    assert shown("tokenizer") == {a.pk} and shown("def567") == {b.pk}
    assert shown("model.preset") == {a.pk, b.pk}
    # The run page sets them, and a tag links to its search.
    page = member.post(
        reverse("dashboard:run-annotate", args=[b.pk]), {"tags": "x, y", "note": "n"}, follow=True
    ).content.decode()
    assert 'href="/runs/?q=x"' in page
    refused = member.post(
        reverse("dashboard:run-annotate", args=[b.pk]), {"tags": "no spaces"}, follow=True
    )
    assert "tags[0]" in refused.content.decode()
    assert Run.objects.get(pk=b.pk).tags == "x,y"
