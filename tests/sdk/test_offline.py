"""Offline costs nothing: a site that is down adds well under a second to a run (start and close),
COSTLAB_MODE=offline never contacts the server and disabled does nothing at all, the spool sits in
the user's cache folder (or COSTLAB_SPOOL_DIR), and a run that someone else ended is said to have
ended: its undeliverable samples are dropped, here and by `python -m costlab resend`."""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx
import pytest

import costlab
from apps.experiments.models import Run
from apps.experiments.services import run_external_finish
from apps.telemetry.models import TelemetrySample
from costlab import delivery
from costlab.__main__ import main as costlab_main
from costlab.client import Client
from costlab.exits import open_runs
from tests.reliability.private import free_port
from tests.sdk.conftest import HELD


def live(test):
    """A test against the live server (a thread of this process) and the committed database."""
    for mark in (pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)):
        test = mark(test)
    return test


def stored_seqs(run_id: int) -> list[int]:
    return sorted(TelemetrySample.objects.filter(run_id=run_id).values_list("seq", flat=True))


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def train(run, steps: int = 10, pause_s: float = 0.04) -> None:
    for step in range(1, steps + 1):
        run.log(step=step, tokens=50)
        time.sleep(pause_s)


@live
def test_a_site_down_adds_under_a_second_and_resend_later_ends_the_run(
    served, tmp_path, monkeypatch, capsys
):
    """No blocking create at the start (it is the sender's, in the background), no waiting out
    flush_timeout_s at the end: the samples go to a spool under COSTLAB_SPOOL_DIR with how the run
    ended, and resend creates the run from its start time, fills it and ends it."""
    monkeypatch.setenv("COSTLAB_SPOOL_DIR", str(tmp_path))
    down = f"http://127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    run = costlab.track(
        served["experiment"].pk, "candidate", url=down, interval_s=0.05, device="cpu", **HELD
    ).start()
    started_s = time.perf_counter() - t0
    train(run)
    t0 = time.perf_counter()
    run.close()
    closed_s = time.perf_counter() - t0
    assert started_s + closed_s < 1.0, f"start {started_s:.2f} s + close {closed_s:.2f} s"
    assert run.run_id is None and run.samples_left == run.samples >= 5
    assert run.spool_path.parent == tmp_path and (run.spool_path / "pending.json").is_file()
    err = capsys.readouterr().err
    assert f"python -m costlab resend {run.spool_path}" in err and "not created" in err
    done = costlab.resend(run.spool_path, url=served["url"])
    assert (done["sent"], done["status"], done["dropped"]) == (run.samples, "succeeded", 0)
    assert not run.spool_path.exists()
    row = Run.objects.get(pk=done["run_id"])
    assert row.run_key == run.run_key and row.status == "succeeded" and row.tokens == 500
    assert stored_seqs(row.pk) == list(range(run.samples))


@live
def test_a_site_that_falls_mid_run_does_not_hold_the_end(served, tmp_path, monkeypatch, capsys):
    """The run was created; the site stops answering; the end gives it one more try and leaves
    the rest (and the finish) to resend at once, instead of waiting out 30 s + 30 s."""
    post = Client.post_samples
    site = {"down": False}

    def flaky(self, run_id, samples, timeout_s):
        if site["down"]:
            raise httpx.ConnectError("connection refused")
        return post(self, run_id, samples, timeout_s)

    monkeypatch.setattr(Client, "post_samples", flaky)
    with costlab.track(
        served["experiment"].pk,
        "candidate",
        interval_s=0.05,
        send_every_s=0.1,
        spool_dir=tmp_path,
        device="cpu",
        **HELD,
    ) as run:
        wait_for(lambda: run.run_id is not None)  # created on the sender thread
        train(run, steps=5)
        site["down"] = True
        train(run, steps=5)
        t0 = time.perf_counter()
    closed_s = time.perf_counter() - t0
    assert closed_s < 0.5, f"close took {closed_s:.2f} s"
    assert run.samples_left > 0 and run.cost_usd is None
    err = capsys.readouterr().err
    assert f"run {run.run_id} rank 0: the site is failing" in err and "stays running" in err
    assert Run.objects.get(pk=run.run_id).status == "running"
    done = costlab.resend(run.spool_path, url=served["url"])
    assert done["run_id"] == run.run_id and done["status"] == "succeeded"
    assert stored_seqs(run.run_id) == list(range(run.samples))


@live
def test_offline_contacts_nothing_and_resend_creates_fills_and_ends_the_run(
    served, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("COSTLAB_MODE", "offline")
    requests: list[httpx.Request] = []
    send = httpx.Client.send

    def counted(self, request, **kwargs):
        requests.append(request)
        return send(self, request, **kwargs)

    monkeypatch.setattr(httpx.Client, "send", counted)
    t0 = time.perf_counter()
    with costlab.track(
        served["experiment"].pk, "candidate", interval_s=0.05, spool_dir=tmp_path, device="cpu"
    ) as run:
        started_s = time.perf_counter() - t0
        train(run, steps=5)
        run.log_eval(1.5)
        train(run, steps=5)
        t0 = time.perf_counter()
    closed_s = time.perf_counter() - t0
    assert started_s + closed_s < 0.5
    assert requests == [] and run.mode == "offline" and run.run_id is None
    assert not any(t.name == "costlab-sender" for t in threading.enumerate())
    assert run.samples_left == run.samples >= 5
    pending = json.loads((run.spool_path / "pending.json").read_text())
    assert pending["finish"] == {"status": "succeeded", "error": ""}
    err = capsys.readouterr().err
    assert "offline (COSTLAB_MODE=offline)" in err
    assert f"python -m costlab resend {run.spool_path}` creates the run" in err
    monkeypatch.delenv("COSTLAB_MODE")
    done = costlab.resend(run.spool_path, url=served["url"])
    assert requests, "resend is what talks to the server"
    assert (done["sent"], done["status"]) == (run.samples, "succeeded")
    row = Run.objects.get(pk=done["run_id"])
    assert row.run_key == run.run_key and row.tokens == 500 and row.arm.name == "candidate"
    assert stored_seqs(row.pk) == list(range(run.samples))


def test_disabled_starts_no_thread_writes_no_file_and_sends_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("COSTLAB_URL", raising=False)  # no client could even be made
    monkeypatch.setenv("COSTLAB_SPOOL_DIR", str(tmp_path))
    before = set(threading.enumerate())
    t0 = time.perf_counter()
    run = costlab.track(1, "control", run_key="quiet", device="cpu", mode="disabled").start()
    run.log(step=1, tokens=5, loss=2.0)
    run.update(loss=1.9)
    run.log_eval(1.0)
    assert set(threading.enumerate()) == before and run not in open_runs
    run.close()
    assert time.perf_counter() - t0 < 0.1
    assert set(threading.enumerate()) == before and not list(tmp_path.iterdir())
    assert run.closed and run.run_id is None and run.samples == 0 and not run._evaluations


def test_an_unknown_mode_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setenv("COSTLAB_MODE", "ofline")
    with pytest.raises(ValueError, match=r"COSTLAB_MODE.*'ofline'.*online, offline, disabled"):
        costlab.Run(1, "control", run_key="k")
    monkeypatch.setenv("COSTLAB_MODE", "Offline")  # case and spaces do not matter
    assert costlab.Run(1, "control", run_key="k").mode == "offline"
    with pytest.raises(ValueError, match="assign"):  # no arm can be asked for offline
        costlab.Run(1, assign=True, run_key="k")
    assert costlab.Run(1, "control", run_key="k", mode="online").mode == "online"


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG layout of Linux")
def test_the_spool_defaults_to_the_users_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("COSTLAB_SPOOL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert delivery.default_spool_root() == tmp_path / "xdg" / "costlab" / "spool"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as XDG says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert delivery.default_spool_root() == tmp_path / "home" / ".cache" / "costlab" / "spool"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert delivery.default_spool_root() == tmp_path / "home" / ".cache" / "costlab" / "spool"
    spool = delivery.Spool(None, prefix="costlab-x-")  # made when needed, under the same root
    spool.append({"seq": 0, "ts": 1.0})
    spool.close()
    assert spool.path.parent == tmp_path / "home" / ".cache" / "costlab" / "spool"
    monkeypatch.setenv("COSTLAB_SPOOL_DIR", str(tmp_path / "mine"))
    assert delivery.default_spool_root() == tmp_path / "mine"
    run = costlab.Run(1, "control", run_key="job/7", device="cpu", interval_s=60, mode="offline")
    run.start().close()  # a run's own folder, named from its run key and rank
    assert run.spool_path == tmp_path / "mine" / "job_7-rank0"
    assert (run.spool_path / "pending.json").is_file() and run.samples_left == run.samples == 2


@live
def test_a_run_ended_elsewhere_is_said_so_and_resend_cleans_up(served, tmp_path, capsys):
    """Someone finished the run (the dashboard, another process): the server refuses its samples
    with 409. The end says the run had already ended, and how, drops what it cannot deliver and
    leaves no spool; a spool left by such a run is removed by resend, which exits 0."""
    exp = served["experiment"]
    with costlab.track(
        exp.pk,
        "candidate",
        interval_s=0.05,
        send_every_s=0.05,
        spool_dir=tmp_path,
        device="cpu",
        **HELD,
    ) as run:
        train(run, steps=3)
        run_external_finish(run=Run.objects.get(pk=run.run_id), status="succeeded")
        train(run, steps=3)
    err = capsys.readouterr().err
    assert f"run {run.run_id} had already ended (succeeded)" in err
    assert "stays" not in err and "python -m costlab resend" not in err
    assert run.status == "succeeded" and run.samples_dropped >= 1 and run.samples_left == 0
    assert not list(tmp_path.iterdir())

    sample = {"seq": 10_000, "ts": time.time(), "step": 9, "rank": 0, "device": "cpu"}
    pending = {
        "experiment": exp.pk,
        "run_key": run.run_key,
        "rank": 0,
        "create": {"experiment": exp.pk, "run_key": run.run_key, "kind": "external"},
        "arm_name": None,
        "finish": {"status": "failed", "error": "boom"},
    }
    for run_id in (run.run_id, None):  # the run known, or only its (ended) run key
        left = tmp_path / f"left-{run_id}"
        left.mkdir()
        (left / "segment-00000001.jsonl").write_text(json.dumps(sample) + "\n")
        (left / "pending.json").write_text(json.dumps({**pending, "run_id": run_id}))
        assert costlab_main(["resend", str(left), "--retry-for", "0"]) == 0
        out, err = capsys.readouterr()
        assert "1 dropped: the run had already ended (succeeded)" in out
        assert "had already ended (succeeded)" in err and not left.exists()
    row = Run.objects.get(pk=run.run_id)
    assert row.status == "succeeded" and row.error == ""
