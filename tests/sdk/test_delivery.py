"""Delivery without a server: the buffer spills to a spool of segments on disk, the sender drains
both through failures and stores each sample (a batch it resends is one the server dedups by seq),
and put() never waits for any of it."""

from __future__ import annotations

import threading
import time

import pytest

from costlab import delivery
from costlab.delivery import Outbox, Refused, Sender, Spool
from costlab.sampler import Progress, Sampler
from costlab.world import World, run_key_for


def samples(n: int, start: int = 0) -> list[dict]:
    return [{"seq": i, "ts": 1.0 + i, "tokens": 10 * i} for i in range(start, start + n)]


def test_the_spool_keeps_order_across_segments_and_deletes_what_was_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(delivery, "SEGMENT_LINES", 4)
    spool = Spool(tmp_path / "spool")
    for s in samples(10):
        spool.append(s)
    assert spool.count == 10 and len(list(spool.path.glob("segment-*.jsonl"))) == 3
    got = []
    while spool.count:
        batch = spool.peek(3)
        got += [s["seq"] for s in batch]
        spool.ack(batch)
    assert got == list(range(10))
    assert not list(spool.path.glob("segment-*.jsonl"))
    spool.append(samples(1, 10)[0])  # after draining: a fresh segment
    reopened = Spool.reopen(spool.path)
    assert reopened.count == 1 and reopened.peek(5)[0]["seq"] == 10


def test_a_full_buffer_spools_and_the_sender_delivers_everything_through_failures(tmp_path):
    outbox = Outbox(capacity=3, spool=Spool(tmp_path / "spool"))
    stored: dict[int, dict] = {}
    calls = {"n": 0}

    def post(batch, timeout_s):
        calls["n"] += 1
        if calls["n"] % 3 == 1:  # every third call fails before the server answers
            raise ConnectionError("site down")
        if calls["n"] % 3 == 2:  # ... or after it stored (the answer lost): resent, deduped
            for s in batch:
                stored.setdefault(s["seq"], s)
            raise ConnectionError("answer lost")
        for s in batch:
            stored.setdefault(s["seq"], s)
        return {"refused": []}

    for s in samples(20):
        outbox.put(s)
    assert outbox.spooled_total == 17
    sender = Sender(outbox=outbox, post=post, every_s=0.01, batch_max=4)
    sender.MAX_BACKOFF_S = 0.05
    sender.start()
    try:
        assert sender.flush(20.0)
    finally:
        sender.stop()
    assert sorted(stored) == list(range(20)) and len(outbox) == 0


def test_put_never_waits_on_a_hung_server(tmp_path):
    outbox = Outbox(capacity=2, spool=Spool(tmp_path / "spool"))
    hung = threading.Event()
    sender = Sender(
        outbox=outbox, post=lambda batch, timeout_s: hung.wait(30) or {}, every_s=0.01
    ).start()
    try:
        worst = 0.0
        for s in samples(200):
            t0 = time.perf_counter()
            outbox.put(s)
            worst = max(worst, time.perf_counter() - t0)
        assert worst < 0.05 and len(outbox) == 200
        assert not sender.flush(0.2)  # the end waits a bounded time, then gives up
    finally:
        hung.set()
        sender.stop()


def test_a_batch_the_server_refuses_is_dropped_and_named_the_rest_goes_on(tmp_path, capsys):
    outbox = Outbox(capacity=100, spool=Spool(tmp_path / "spool"))
    for s in samples(6):
        outbox.put(s)

    def post(batch, timeout_s):
        if any(s["seq"] == 0 for s in batch):
            raise Refused(400, "samples[0].ts: goes backwards")
        return {"refused": []}

    sender = Sender(outbox=outbox, post=post, every_s=0.01, batch_max=3).start()
    try:
        assert sender.flush(5.0)
    finally:
        sender.stop()
    assert sender.sent == 3 and sender.refused_samples == 3
    assert "goes backwards" in capsys.readouterr().err


def wait_for(condition, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_end_gives_a_failing_site_one_more_try_and_a_falling_one_patience(tmp_path):
    """A site already down as the flush begins: one more try, then give up (the spool takes the
    rest). A site that answers: everything. One that falls during the flush: `patience_s`."""
    outbox = Outbox(capacity=100, spool=Spool(tmp_path / "spool"))
    site = {"down": True, "tries": 0}

    def post(batch, timeout_s):
        site["tries"] += 1
        if site["down"]:
            raise ConnectionError("connection refused")
        return {"refused": []}

    for s in samples(5):
        outbox.put(s)
    sender = Sender(outbox=outbox, post=post, every_s=0.01).start()
    try:
        wait_for(lambda: sender.outage_since is not None)
        tries, t0 = site["tries"], time.perf_counter()
        assert not sender.flush(30.0, patience_s=5.0)
        assert time.perf_counter() - t0 < 0.3 and site["tries"] == tries + 1
        site["down"] = False
        assert sender.flush(30.0, patience_s=5.0) and len(outbox) == 0
        for s in samples(5, 5):
            outbox.put(s)
        site["down"] = True
        t0 = time.perf_counter()
        assert not sender.flush(30.0, patience_s=0.3)
        assert 0.3 <= time.perf_counter() - t0 < 1.5 and len(outbox) == 5
    finally:
        sender.stop()


def test_the_end_does_not_wait_on_a_create_that_hangs(tmp_path, monkeypatch):
    """The run's creation hangs (a name that does not resolve, a host that drops packets): the
    end waits PROBE_S, not flush_timeout_s, and stop() does not wait for the stuck thread."""
    monkeypatch.setattr(Sender, "PROBE_S", 0.2)
    hung = threading.Event()
    outbox = Outbox(capacity=100, spool=Spool(tmp_path / "spool"))
    outbox.put(samples(1)[0])
    sender = Sender(
        outbox=outbox, post=lambda batch, timeout_s: {}, ready=lambda timeout_s: hung.wait(30)
    ).start()
    try:
        t0 = time.perf_counter()
        assert not sender.flush(30.0, patience_s=5.0)
        sender.stop(join_s=0.05)
        assert time.perf_counter() - t0 < 0.5 and sender.failing
    finally:
        hung.set()
        sender.stop()


def test_a_refusal_says_when_the_run_had_already_ended():
    finished = "status: run 6 is succeeded; only a running external run can take telemetry"
    assert Refused(409, finished, "run_finished").run_ended == "succeeded"
    failed = "POST runs/6/finish/: " + finished.replace("succeeded", "failed")
    assert Refused(409, failed).run_ended == "failed"
    assert Refused(409, "run_key 'k' names run 6, already cancelled: ...").run_ended == "cancelled"
    assert Refused(400, "status: run 6 is already lost; only queued ...").run_ended == "lost"
    assert Refused(409, "status: run 6 is ...", "run_finished").run_ended == "ended"
    assert (
        Refused(409, "stream: run 6 rank 0 is already streamed by another sampler").run_ended
        is None
    )
    assert Refused(400, "samples[0].ts: run 6 is succeeded?").run_ended is None
    assert Refused(404, "run 6 is succeeded").run_ended is None


class FixedProbe:
    label, estimated = "cpu", True

    def __init__(self):
        self.energy = 0.0

    def read(self):
        from costlab.probes import Reading

        self.energy += 5.0
        return Reading(util_pct=50.0, power_w=None, energy_j=self.energy)

    def close(self):
        pass


def test_rank_streams_share_one_seq_space_and_counters_never_run_back():
    progress = {"p": Progress(0, 0, None, 0.0, 0, None, time.perf_counter())}
    out = {0: [], 1: []}
    samplers = {
        r: Sampler(
            probe=FixedProbe(),
            progress=lambda: progress["p"],
            interval_s=3600,
            emit=out[r].append,
            rank=r,
            world_size=2,
        )
        for r in (0, 1)
    }
    for r in (0, 1):
        for tokens in (100, 50, 300):  # a lazily counted figure may read low once: never sent so
            progress["p"] = progress["p"]._replace(tokens_own=tokens)
            samplers[r].sample()
    assert [s["seq"] for s in out[0]] == [0, 2, 4] and [s["seq"] for s in out[1]] == [1, 3, 5]
    assert [s["tokens"] for s in out[0]] == [200, 200, 600]  # this rank's x the world size
    assert [s["energy_j"] for s in out[0]] == [5.0, 10.0, 15.0]  # from the counter's start
    assert all(s["rank"] == 1 for s in out[1])


def test_the_ranks_of_a_job_need_one_run_key(monkeypatch):
    for name in ("COSTLAB_RUN_KEY", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert run_key_for(World(), None).startswith("sdk-")
    with pytest.raises(ValueError, match="run key"):
        run_key_for(World(rank=1, local_rank=1, size=2), None)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert run_key_for(World(rank=1, local_rank=1, size=2), None) == "torchrun-abc-0"
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert World.from_env() == World(rank=3, local_rank=3, size=4)
