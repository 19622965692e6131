"""The run page of a DDP run shows each rank's device, so a straggler is visible."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.billing.services import telemetry_ingest
from tests.apps.dashboard.world import run_of

pytestmark = pytest.mark.django_db


def test_a_ddp_run_page_shows_utilisation_and_step_time_per_rank(member, w):
    run = run_of(w.candidate, status="running", world_size=2, device="cpu x2")
    start = timezone.now() - timedelta(seconds=30)
    samples = []
    for i in range(10):  # rank 1 is the straggler: idle half the time, its steps three times longer
        for rank, util, step_time in ((0, 90.0, 0.1), (1, 30.0, 0.3)):
            samples.append(
                {
                    "seq": len(samples),
                    "ts": (start + timedelta(seconds=i)).isoformat(),
                    "step": i,
                    "rank": rank,
                    "device": "cpu",
                    "util_pct": util,
                    "step_time_s": step_time,
                }
            )
    telemetry_ingest(run_id=run.pk, samples=samples, attempt=run.attempts)
    html = member.get(reverse("dashboard:run", args=[run.pk])).content.decode()
    table = html[html.index('id="ranks"') :]
    rows = [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r)).strip()
        for r in re.findall(r"<tr>(.*?)</tr>", table[: table.index("</table>")], re.S)
    ]
    assert rows[1].startswith("0 cpu 90") and "0.1 s" in rows[1]
    assert rows[2].startswith("1 cpu 30") and "0.3 s" in rows[2]
    single = run_of(w.candidate)
    assert (
        'id="ranks"' not in member.get(reverse("dashboard:run", args=[single.pk])).content.decode()
    )
