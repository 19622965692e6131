"""Chart series: whole history within a point budget, peaks kept, settled blocks rolled up once, on
beat.

A page view only reads: the blocks are built by series_blocks_roll_due (beat), never by
run_series."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from apps.dashboard import series as chart_series
from apps.dashboard.models import SeriesBlock
from apps.dashboard.series import RAW_MAX, live_series, run_series
from apps.dashboard.services import series_blocks_refresh, series_blocks_roll_due
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from tests.apps.dashboard.world import run_of, train

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
FIELDS = ("util_pct", "power_w")


def stored(
    run: Run, n: int, *, priced: int, spike_at: int | None = None, estimated_from: int | None = None
) -> Run:
    """n samples stored directly (fast), the first `priced` of them settled by pricing."""
    TelemetrySample.objects.bulk_create(
        [
            TelemetrySample(
                run=run,
                seq=i,
                ts=T0 + timedelta(seconds=i),
                util_pct=100.0 if i == spike_at else 50.0 + i % 10,
                power_w=300.0,
                estimated=estimated_from is not None and i >= estimated_from,
            )
            for i in range(n)
        ],
        batch_size=5000,
    )
    Run.objects.filter(pk=run.pk).update(last_seq=n - 1, priced_seq=priced - 1)
    run.refresh_from_db()
    return run


def test_a_short_run_is_drawn_sample_by_sample(w):
    run = train(run_of(w.control), n=40, util=61.0)
    band = run_series(runs=[run], fields=FIELDS, budget=100).series[run.pk]["util_pct"]
    assert len(band.x) == 40 and band.y == band.lo == band.hi == [61.0] * 40
    assert band.x == sorted(band.x)
    assert not SeriesBlock.objects.exists(), "no blocks for a run this small"


def test_a_run_over_budget_is_bucketed_and_keeps_its_peak(w):
    run = stored(run_of(w.control), 1000, priced=1000, spike_at=777)
    band = run_series(runs=[run], fields=FIELDS, budget=100).series[run.pk]["util_pct"]
    assert 90 <= len(band.x) <= 100
    assert max(band.hi) == 100.0 and min(band.lo) == 50.0, "min/max band keeps extremes"
    assert max(band.y) < 100.0, "the mean line is a mean"
    assert band.x[0] >= int(T0.timestamp() * 1000) and band.x == sorted(band.x)


@pytest.mark.slow
def test_a_long_run_is_drawn_from_blocks_of_settled_samples(w):
    n, priced = RAW_MAX + 5000, RAW_MAX + 1000
    run = stored(run_of(w.control), n, priced=priced, spike_at=123, estimated_from=n - 10)
    assert series_blocks_roll_due() == 1
    series = run_series(runs=[run], fields=FIELDS, budget=200)
    blocks = SeriesBlock.objects.filter(run=run)
    assert blocks.count() == priced // SeriesBlock.SEQS, "only whole blocks of settled samples"
    assert blocks.order_by("-block").first().block == priced // SeriesBlock.SEQS - 1
    assert (
        sum(blocks.values_list("samples", flat=True))
        == priced // SeriesBlock.SEQS * SeriesBlock.SEQS
    )
    band = series.series[run.pk]["util_pct"]
    assert len(band.x) <= 200 + 200 // 4
    assert max(band.hi) == 100.0, "a one-sample peak survives the rollup"
    span_ms = (n - 1) * 1000
    assert band.x[-1] - band.x[0] > 0.99 * span_ms, "history and tail together cover the whole run"
    assert run.pk in series.estimated, "an estimated sample in the tail marks the run"


def test_blocks_are_rolled_up_once_and_then_incrementally(w):
    run = stored(run_of(w.control), RAW_MAX + 640, priced=RAW_MAX + 640)
    upto = series_blocks_refresh(runs=[run])
    count = SeriesBlock.objects.filter(run=run).count()
    assert upto[run.pk] == count * SeriesBlock.SEQS
    with CaptureQueriesContext(connection) as queries:
        assert series_blocks_refresh(runs=[run]) == upto
    assert len(queries) == 1, "nothing new: one indexed read, no insert"
    more = [
        TelemetrySample(run=run, seq=run.last_seq + 1 + i, ts=T0, util_pct=1.0)
        for i in range(SeriesBlock.SEQS)
    ]
    TelemetrySample.objects.bulk_create(more)
    Run.objects.filter(pk=run.pk).update(
        last_seq=run.last_seq + SeriesBlock.SEQS, priced_seq=run.priced_seq + SeriesBlock.SEQS
    )
    run.refresh_from_db()
    assert series_blocks_refresh(runs=[run])[run.pk] == upto[run.pk] + SeriesBlock.SEQS
    assert SeriesBlock.objects.filter(run=run).count() == count + 1


def test_a_page_view_writes_nothing_and_shows_the_tail_until_beat_rolls_up(w):
    n = RAW_MAX + 3000
    run = stored(run_of(w.control, status=Run.Status.RUNNING), n, priced=n, spike_at=10)
    with CaptureQueriesContext(connection) as queries:
        band = run_series(runs=[run], fields=FIELDS, budget=200).series[run.pk]["util_pct"]
    writes = [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith("SELECT")]
    assert writes == [] and not SeriesBlock.objects.exists(), "a read never rolls up"
    assert band.x[0] >= int((T0 + timedelta(seconds=n - RAW_MAX)).timestamp() * 1000), (
        "only the raw tail so far"
    )
    assert max(band.hi) < 100.0, "the early peak is not in the tail"

    assert series_blocks_roll_due() == 1
    band = run_series(runs=[run], fields=FIELDS, budget=200).series[run.pk]["util_pct"]
    assert max(band.hi) == 100.0 and band.x[0] < int(
        (T0 + timedelta(seconds=100)).timestamp() * 1000
    )


def test_beat_rolls_up_only_the_runs_with_a_new_settled_block(w):
    running = Run.Status.RUNNING
    behind = stored(run_of(w.control, status=running), RAW_MAX + 200, priced=RAW_MAX + 200)
    small = stored(
        run_of(w.control, status=running), SeriesBlock.SEQS - 1, priced=SeriesBlock.SEQS - 1
    )
    assert series_blocks_roll_due() == 1 and not SeriesBlock.objects.filter(run=small).exists()
    assert series_blocks_roll_due() == 0, "up to date: nothing is due"
    # A few more settled samples, short of a whole block: still nothing due; a whole block: due
    # again.
    TelemetrySample.objects.bulk_create(
        [
            TelemetrySample(run=behind, seq=behind.last_seq + 1 + i, ts=T0, util_pct=1.0)
            for i in range(SeriesBlock.SEQS)
        ]
    )
    short = (
        SeriesBlock.SEQS - (behind.priced_seq + 1) % SeriesBlock.SEQS - 1
    )  # one sample short of a block
    Run.objects.filter(pk=behind.pk).update(priced_seq=F("priced_seq") + short)
    assert series_blocks_roll_due() == 0
    Run.objects.filter(pk=behind.pk).update(priced_seq=F("priced_seq") + 1)
    assert series_blocks_roll_due() == 1


def test_beat_rolls_up_a_finished_runs_last_samples_under_a_block(w):
    """Once a finished run is settled, its last block is rolled up however short: its chart is
    then read from blocks alone (what stays after retention drops the samples)."""
    n = RAW_MAX + 100
    run = stored(run_of(w.control), n, priced=n, spike_at=n - 5)
    assert series_blocks_roll_due() >= 1  # (the world's other finished runs too)
    last = SeriesBlock.objects.filter(run=run).order_by("-block").first()
    assert last.block == (n - 1) // SeriesBlock.SEQS and last.samples == n % SeriesBlock.SEQS
    assert series_blocks_roll_due() == 0, "rolled once"
    before = run_series(runs=[run], fields=FIELDS, budget=200).series[run.pk]["util_pct"]
    TelemetrySample.objects.filter(run=run).delete()
    after = run_series(runs=[run], fields=FIELDS, budget=200).series[run.pk]["util_pct"]
    assert (after.x, after.y, after.hi) == (before.x, before.y, before.hi)
    assert max(after.hi) == 100.0, "the last samples' peak is in the blocks"


def test_a_ddp_runs_line_is_the_mean_of_its_ranks_not_a_zigzag(w):
    run = run_of(w.control, world_size=2)
    TelemetrySample.objects.bulk_create(
        [  # the ranks' samples interleave in one seq order
            TelemetrySample(
                run=run,
                seq=i,
                rank=i % 2,
                ts=T0 + timedelta(seconds=i // 2),
                util_pct=90.0 if i % 2 else 30.0,
                power_w=300.0,
            )
            for i in range(40)
        ]
    )
    Run.objects.filter(pk=run.pk).update(last_seq=39, priced_seq=39)
    run.refresh_from_db()
    band = run_series(runs=[run], fields=FIELDS, budget=100).series[run.pk]["util_pct"]
    assert len(band.x) == 20 and set(band.y) == {60.0}, "one point per step of both ranks"
    assert set(band.lo) == {30.0} and set(band.hi) == {90.0}, (
        "the band shows the spread across devices"
    )
    live = live_series(runs=[run], fields=FIELDS, since=T0 + timedelta(seconds=15)).series[run.pk][
        "util_pct"
    ]
    assert live.y and set(live.y) == {60.0}


def test_live_series_returns_only_samples_since_the_cursor(w):
    run = stored(run_of(w.control), 100, priced=100)
    since = T0 + timedelta(seconds=80)
    band = live_series(runs=[run], fields=FIELDS, since=since).series[run.pk]["util_pct"]
    first = int((since - timedelta(seconds=10)).timestamp() * 1000)  # the overlap re-reads 10 s
    assert band.x[0] == first and len(band.x) == 30
    assert band.y == band.lo == band.hi


def test_each_point_says_where_the_run_was_from_samples_and_from_blocks(w, monkeypatch):
    """The step and cumulative tokens a chart drawn against steps or tokens reads, per point, at the
    points' own times: from raw samples, from rolled-up blocks, and live."""
    n = 640  # ten blocks
    run = stored(run_of(w.control), n, priced=n)
    TelemetrySample.objects.filter(run=run).update(step=F("seq") + 1, tokens=(F("seq") + 1) * 1000)
    raw = run_series(runs=[run], fields=FIELDS, budget=n)
    progress = raw.progress_json()[str(run.pk)]
    assert progress["step"]["y"] == [float(s) for s in range(1, n + 1)]
    assert progress["tokens"]["y"][-1] == n * 1000.0
    assert progress["step"]["x"] == raw.series[run.pk]["util_pct"].x, "the same points"

    series_blocks_refresh(runs=[run])
    monkeypatch.setattr(chart_series, "RAW_MAX", 100)  # read from the blocks, one per point
    blocks = run_series(runs=[run], fields=FIELDS, budget=10)
    progress = blocks.progress_json()[str(run.pk)]
    assert progress["step"]["x"] == blocks.series[run.pk]["util_pct"].x
    assert progress["step"]["y"] == [64 * b + 32.5 for b in range(10)], "each block's mean step"
    assert progress["tokens"]["y"][0] == 32_500.0

    since = T0 + timedelta(seconds=n - 20)
    live = live_series(runs=[run], fields=FIELDS, since=since).progress_json()[str(run.pk)]
    assert live["step"]["y"][-1] == float(n) and live["tokens"]["y"][-1] == n * 1000.0
    assert live["step"]["x"] == sorted(live["step"]["x"])


def test_runs_without_samples_have_empty_series(w):
    run = run_of(w.control, status=Run.Status.QUEUED)
    assert run_series(runs=[run], fields=FIELDS, budget=100).as_json(FIELDS) == {
        "util_pct": {},
        "power_w": {},
    }


def test_unknown_fields_are_refused(w):
    with pytest.raises(ValueError, match="mfu"):
        run_series(runs=[], fields=("mfu",), budget=10)
