"""Two attribution ticks at once (real threads, real Postgres connections):
one result is committed."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from apps.attribution import services
from apps.attribution.models import AttributionWindow, RunCursor, RunWindow
from apps.attribution.services import attribution_tick
from apps.experiments.models import Run
from tests.apps.attribution.lab import T0, Lab

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def race(nows):
    barrier, results, errors = threading.Barrier(len(nows)), [], []

    def tick(now):
        try:
            barrier.wait()
            results.append(attribution_tick(now=now))
        except Exception as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=tick, args=(now,)) for now in nows]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return results


def test_two_concurrent_ticks_commit_one_result(monkeypatch):
    labs = [Lab({"control": 1.0, "b": 1.1}, seed=50 + i) for i in range(3)]
    for lab in labs:
        lab.step()
    recorded = services.observations_record

    def slowly(**kwargs):  # hold the lock long enough that the ticks surely overlap
        out = recorded(**kwargs)
        time.sleep(0.5)
        return out

    monkeypatch.setattr(services, "observations_record", slowly)
    now = T0 + timedelta(seconds=30)
    results = race([now, now + timedelta(milliseconds=200)])
    assert sorted(r.ran for r in results) == [False, True]
    winner = next(r for r in results if r.ran)
    per_run_window = sum(len(lab.runs) for lab in labs)  # one observation per run in its window
    assert winner.windows == 3 and winner.observations == per_run_window
    loser = next(r for r in results if not r.ran)
    assert loser.note == "another attribution tick holds the lock"

    assert AttributionWindow.objects.count() == 3
    assert RunWindow.objects.count() == per_run_window
    for run in Run.objects.all():
        cursor = RunCursor.objects.get(run=run)
        assert (cursor.priced_seq, cursor.tokens, cursor.cost_usd) == (
            run.priced_seq,
            run.tokens,
            run.cost_usd,
        )
    # The next tick finds nothing new: the first one covered it all.
    assert attribution_tick(now=now + timedelta(seconds=30)).windows == 0


def test_a_tick_after_a_finished_one_sees_its_watermark():
    lab = Lab({"control": 1.0, "b": 1.0}, seed=60)
    lab.step()
    now = T0 + timedelta(seconds=30)
    first, second = race([now, now])
    assert sorted([first.windows, second.windows]) == [0, 1]
    assert AttributionWindow.objects.count() == 1 and RunWindow.objects.count() == len(lab.runs)
