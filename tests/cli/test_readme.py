"""The README's "first three things" run as written: its shell block is executed line by line by
bash against a live server, and any command that exits non-zero fails the test (the last review
found its CI example failing at line 1).

What is not the README's own is put in its place, and only that: the server's address for
127.0.0.1:8000, the experiment's id for `3`, and the token `api_token_create` printed for `...`.
A fake worker (test_cli's) trains nothing: it claims the submitted run and finishes it, priced
and evaluated like the arm's earlier runs, so the gate has its evidence.
"""

from __future__ import annotations

import re
import subprocess
import threading
from decimal import Decimal

import pytest
from django.conf import settings

from apps.experiments.models import Run
from tests.cli.conftest import priced_run
from tests.cli.test_cli import finish_when_submitted
from tests.factories import ArmFactory, final_evaluation
from tests.helpers import ROOT, clean_env

pytestmark = [pytest.mark.services, pytest.mark.slow]

SECTION = "## The first three things to do"
STRATEGY = "gpu_runtime/examples/tiny.yaml"


def readme_shell_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


def priced_and_evaluated(usd: str, loss: float):
    """What the fake worker's run measured, as the arm's earlier runs did; then a tick."""

    def then(run: Run) -> None:
        from apps.attribution.services import attribution_tick

        Run.objects.filter(pk=run.pk).update(
            priced_seq=5,
            last_seq=5,
            tokens=1_000_000,
            steps=50,
            cost_usd=Decimal(usd),
            device_seconds=30.0,
        )
        run.refresh_from_db()
        final_evaluation(run, loss, at=run.finished_at)
        attribution_tick()

    return then


@pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"),
    reason="manage.py in a subprocess needs the test database on a server (Postgres)",
)
def test_the_readme_ci_example_runs_as_written(lab):
    (block,) = readme_shell_blocks()[-1:]  # the first three things' one shell block
    experiment = lab["experiment"]
    experiment.tenant.slug = "demo"  # the README's tenant: the demo's
    experiment.tenant.save()
    experiment.min_runs_per_arm = experiment.min_cs_runs_per_arm = 3
    experiment.min_samples_per_arm = 1
    experiment.save()
    strategy = (ROOT / STRATEGY).read_text()
    branch = ArmFactory(experiment=experiment, name="pr-123", strategy_yaml=strategy)
    for arm, usd in ((lab["control"], "1.00"), (branch, "0.98"), (lab["control"], "1.01")):
        for i in range(2):
            run = priced_run(arm, f"{Decimal(usd) + Decimal(i) / 1000:.3f}")
            final_evaluation(run, 3.0 + i / 1000, at=run.created_at)
    stop = threading.Event()
    worker = finish_when_submitted(
        "succeeded", then=priced_and_evaluated("0.985", 3.0005), stop=stop, wait_s=60
    )

    script = block
    assert "http://127.0.0.1:8000" in script and "COSTLAB_TOKEN=..." in script
    script = script.replace("http://127.0.0.1:8000", lab["url"])
    script = re.sub(
        r"^(python manage\.py api_token_create [^#\n]*?)\s*(#.*)?$",
        r"TOKEN=$(\1)",
        script,
        flags=re.M,
    )
    script = script.replace("COSTLAB_TOKEN=...", "COSTLAB_TOKEN=$TOKEN")
    script = re.sub(r"(--experiment|gate) 3\b", rf"\1 {experiment.pk}", script)
    assert "TOKEN=$(python manage.py" in script and f"gate {experiment.pk}" in script
    env = clean_env(DATABASE_URL=database_url(), REDIS_URL=settings.REDIS_URL)
    env.pop("COSTLAB_URL", None)
    env.pop("COSTLAB_TOKEN", None)
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop.set()
        worker.join(5)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "PASS: arm 'pr-123'" in done.stdout, done.stdout
