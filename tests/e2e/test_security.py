"""The hardened web surface in a real browser: a strict Content-Security-Policy that no page
violates, chart labels shown as text (never as HTML), and sign-in throttling on /login/ and
/admin/login/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.utils import timezone

from apps.attribution.services import attribution_tick
from apps.demo.services import demo_seed
from apps.experiments.models import Run
from tests.apps.dashboard.world import run_of, train
from tests.e2e.conftest import charts_drawn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HOSTILE = '<a href="https://evil.example/login">SIGN IN AGAIN</a>'

# Before any page script runs: record every CSP violation the page reports.
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__violations.push(e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline') + ' at ' +
                           e.sourceFile + ':' + e.lineNumber);
});
"""


@pytest.fixture
def demo():
    """The demo after some training and two attribution windows; the candidate arm has a hostile
    name."""
    seed = demo_seed()
    experiment = seed.experiment
    control = experiment.arms.get(is_control=True)
    candidate = experiment.arms.get(name="costlab-optimized")
    candidate.name = HOSTILE
    candidate.save(update_fields=["name"])
    now = timezone.now()
    done = [run_of(arm) for arm in (control, control, candidate, candidate)]
    for run in done:
        train(run, n=60, start=now - timedelta(minutes=8))
    attribution_tick(now=now - timedelta(seconds=70))
    for run in done:
        train(run, n=30, start=now - timedelta(minutes=6))
    attribution_tick(now=now - timedelta(seconds=35))
    return seed, experiment, done


def sign_in(page, base: str, username: str, password: str, path: str = "/login/") -> None:
    page.goto(base + path)
    if page.locator("#id_username").count() == 0:  # locked out: the lockout page has no form
        page.goto(base + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("[type=submit]")
    page.wait_for_load_state()


def watch(page) -> list[str]:
    """Console errors and CSP violations of every page this tab loads."""
    problems: list[str] = []
    page.add_init_script(RECORD_VIOLATIONS)
    page.on(
        "console",
        lambda m: (
            problems.append(f"console {m.type}: {m.text} at {m.location.get('url')}")
            if m.type == "error" and "status of 404" not in m.text
            else None
        ),
    )
    page.on(
        "response",
        lambda r: (
            problems.append(f"{r.status} {r.url}")
            if r.status >= 400 and "/no-such-page/" not in r.url
            else None
        ),
    )
    return problems


def visit(page, url: str, problems: list[str], *, settle: str | None = None) -> None:
    response = page.goto(url)
    policy = response.headers.get("content-security-policy", "")
    assert (
        "script-src 'self'" in policy
        and "unsafe-eval" not in policy.split("script-src")[1].split(";")[0]
    ), (url, policy)
    if settle:
        page.wait_for_function(settle)
    page.wait_for_timeout(300)  # a poll of the live endpoint, a late style
    problems.extend(f"{url}: {v}" for v in page.evaluate("window.__violations || []"))


def test_no_csp_violation_on_any_page(page, live_server, demo, monkeypatch):
    from apps.sweeps import services as sweeps

    seed, experiment, runs = demo
    from apps.sweeps import probes

    monkeypatch.setattr(probes, "probe_send", lambda **_: None)  # the page only: no probe runs
    sweep = sweeps.sweep_create(
        tenant=experiment.tenant,
        name="batch",
        probe_count=2,
        probe_steps=2,
        parallelism=1,
        sampler="grid",
        base_strategy_yaml="model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
        "train: {steps: 5, global_batch: 2}\n",
        space={"train.global_batch": [1, 2]},
    )
    problems = watch(page)
    base = live_server.url
    visit(page, base + "/login/", problems)
    sign_in(page, base, seed.admin_username, seed.admin_password)
    charts = charts_drawn(2)
    checked = (
        "() => [...document.querySelectorAll('.strategy-status')].some(e => "
        "e.textContent.includes('valid'))"
    )
    for path, settle in [
        ("/", None),
        (f"/experiments/{experiment.pk}/", charts),
        (f"/runs/{runs[0].pk}/", charts),
        ("/pricing/", None),
        ("/sweeps/", None),
        (f"/sweeps/{sweep.pk}/", "() => !!document.getElementById('sweep-chart').data"),
        ("/runs/", None),
        (f"/runs/compare/?run={runs[0].pk}&run={runs[2].pk}", None),
        ("/spend/", None),
        ("/experiments/new/", None),
        (f"/experiments/{experiment.pk}/edit/", None),
        (f"/experiments/{experiment.pk}/runs/new/", None),
        ("/no-such-page/", None),
        ("/admin/", None),
        (f"/admin/experiments/experiment/{experiment.pk}/change/", None),
        ("/admin/pricing/pricingtable/", None),
        ("/admin/experiments/arm/add/", None),
        ("/api/schema/swagger/", "() => !!document.querySelector('.swagger-ui .info')"),
        ("/api/v1/", None),
        # Authoring, the runs page, compare, spend (the strategy editors check their text through
        # the API).
        ("/runs/", None),
        (f"/runs/compare/?run={runs[0].pk}&run={runs[2].pk}", charts),
        ("/spend/", "() => document.querySelectorAll('.spend-chart .main-svg').length >= 1"),
        ("/experiments/new/", checked),
        (f"/experiments/{experiment.pk}/edit/", checked),
        (f"/experiments/{experiment.pk}/runs/new/", None),
        ("/sweeps/new/", checked),
    ]:
        visit(page, base + path, problems, settle=settle)
    assert not problems, "\n".join(problems)
    assert not page.js_errors, page.js_errors


def test_hostile_arm_name_is_text_in_charts(page, live_server, demo):
    seed, experiment, runs = demo
    problems = watch(page)
    sign_in(page, live_server.url, seed.admin_username, seed.admin_password)
    hostile_run = next(r for r in runs if r.arm.name == HOSTILE)
    other = next(r for r in runs if r.arm.name != HOSTILE)
    for path in (
        f"/experiments/{experiment.pk}/",
        f"/runs/{hostile_run.pk}/",
        f"/runs/compare/?run={hostile_run.pk}&run={other.pk}",
        "/spend/",
    ):
        page.goto(live_server.url + path)
        page.wait_for_function(
            charts_drawn(1), timeout=20_000
        )  # all of them: what follows checks every chart
        # The legends are HTML beside the charts (legend.js), their names set as text.
        page.wait_for_function("() => document.querySelectorAll('.legend-entry').length >= 1")
        links = page.evaluate(
            "() => Array.from(document.querySelectorAll('.chart a, .chart-legend a'))"
            ".map(a => a.outerHTML)"
        )
        assert not links, (path, links)
        legends = page.evaluate(
            "() => Array.from(document.querySelectorAll('.legend-entry')).map(t => t.textContent)"
        )
        assert any(HOSTILE in text for text in legends), (path, legends)
        # Hover labels too: hover the hostile line (a run's third trace; on the spend page, its
        # arm's area) programmatically, on the page's first chart that draws one.
        hover = page.evaluate(
            "(name) => {\n"
            "            const hostile = t => t.name && t.name.includes('SIGN IN AGAIN') "
            "&& t.showlegend !== false;\n"
            "            const el = [...document.querySelectorAll('.chart')]"
            ".find(c => (c.data || []).some(hostile));\n"
            "            const i = el.data.findIndex(hostile);\n"
            "            Plotly.Fx.hover(el, [{curveNumber: i, "
            "pointNumber: Math.min(1, el.data[i].x.length - 1)}]);\n"
            "            const layer = el.querySelector('.hoverlayer');\n"
            "            return {text: layer.textContent, "
            "links: layer.querySelectorAll('a').length}; }",
            HOSTILE,
        )
        assert hover["links"] == 0 and "SIGN IN AGAIN</a>" in hover["text"], (path, hover)
        # The page's tables escape it too (Django's autoescape).
        assert page.locator('a[href="https://evil.example/login"]').count() == 0
    assert not problems, problems


def _lockout_case(page, base: str, path: str, username: str, password: str) -> None:
    for attempt in range(1, 11):
        sign_in(page, base, username, "wrong-" + password, path)
        if attempt < 10:
            assert page.locator("#id_password").count() == 1, "a wrong password: the form again"
    assert page.locator("#locked-out").count() == 1, (
        "the 10th failure locks the username out from this address"
    )
    sign_in(page, base, username, password, path)
    assert page.locator("#locked-out").count() == 1, page.content()[:2000]
    assert "Too many failed sign-ins" in page.locator("#locked-out").inner_text()
    assert "15 min" in page.locator("#locked-out").inner_text()


def test_login_lockout_dashboard_and_admin(page, live_server, demo):
    """10 wrong passwords, then the right one is refused during the lockout: on /login/ and
    /admin/login/."""
    seed, experiment, runs = demo
    base = live_server.url
    _lockout_case(page, base, "/login/", seed.admin_username, seed.admin_password)
    page.goto(base + "/")
    assert "/login/" in page.url, "still signed out"

    # The admin's sign-in is throttled the same way (its own count: another username).
    from tests.factories import UserFactory

    staff = UserFactory(username="ops", is_staff=True, is_superuser=True)
    staff.set_password("ops-pass-for-tests")
    staff.save()
    _lockout_case(page, base, "/admin/login/", "ops", "ops-pass-for-tests")

    # Once the cool-off has passed, the right password signs in again.
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    sign_in(page, base, seed.admin_username, seed.admin_password)
    page.goto(base + "/")
    assert "/login/" not in page.url
    assert Run.objects.exists()
