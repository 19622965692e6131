"""costlab.track against a live server: how a block ends is how the run ends (succeeded, failed on
an exception, which goes on up; cancelled on Ctrl-C), and an outage at the start loses nothing:
the samples wait in the spool, and `python -m costlab resend` creates the run, sends them and ends
it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import costlab
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from costlab.run import SEND_EVERY_S
from tests.helpers import ROOT, clean_env
from tests.reliability.private import free_port
from tests.sdk.conftest import HELD

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def stored_seqs(run_id: int) -> list[int]:
    return sorted(TelemetrySample.objects.filter(run_id=run_id).values_list("seq", flat=True))


def test_a_block_that_ends_normally_succeeds_with_every_sample(served):
    exp = served["experiment"]
    with costlab.track(exp.pk, "candidate", interval_s=0.05, device="cpu", **HELD) as run:
        for step in range(1, 21):
            run.log(step=step, tokens=100, loss=2.0 - step / 100)
            if step % 5 == 0:
                time.sleep(0.05)
    row = Run.objects.get(pk=run.run_id)
    assert (row.kind, row.status, row.arm.name, row.run_key) == (
        "external",
        "succeeded",
        "candidate",
        run.run_key,
    )
    assert run.status == "succeeded" and run.arm == "candidate"
    assert stored_seqs(run.run_id) == list(range(run.samples)) and run.samples >= 3
    assert row.tokens == 2000 and row.steps == 20
    assert row.cost_usd > 0 and float(run.cost_usd) == float(row.cost_usd)
    last = TelemetrySample.objects.filter(run_id=run.run_id).order_by("-seq").first()
    assert (
        last.loss == pytest.approx(1.8)
        and last.device == "cpu"
        and last.estimated
        in (
            True,
            False,
        )
    )


def test_an_exception_fails_the_run_and_is_raised(served):
    with pytest.raises(RuntimeError, match="diverged"):
        with costlab.track(served["experiment"].pk, "control", device="cpu") as run:
            run.log(tokens=10, loss=1.0)
            raise RuntimeError("loss diverged")
    row = Run.objects.get(pk=run.run_id)
    assert row.status == "failed" and "RuntimeError: loss diverged" in row.error


def test_ctrl_c_cancels_the_run(served):
    with pytest.raises(KeyboardInterrupt):
        with costlab.track(served["experiment"].pk, "control", device="cpu") as run:
            run.log(tokens=10)
            raise KeyboardInterrupt
    assert Run.objects.get(pk=run.run_id).status == "cancelled"


def test_a_process_that_dies_with_the_run_open_fails_it(served):
    """No `with`, no close(): the uncaught exception that ends the process ends the run failed,
    as the process exits (the Trainer callback's failure path)."""
    code = (
        "import costlab\n"
        f"run = costlab.track({served['experiment'].pk}, 'control', run_key='dies', device='cpu')"
        ".start()\n"
        "run.log(tokens=10)\n"
        "raise MemoryError('out of memory at step 1')\n"
    )
    env = clean_env(COSTLAB_URL=served["url"], COSTLAB_TOKEN=served["token"])
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "MemoryError" in proc.stderr
    row = Run.objects.get(run_key="dies")
    assert row.status == "failed" and "MemoryError: out of memory at step 1" in row.error
    assert row.tokens == 10


def test_the_same_run_key_joins_the_same_run_and_a_finished_one_is_refused(served):
    exp = served["experiment"]
    first = costlab.track(exp.pk, "ddp", run_key="job-7", device="cpu", world_size=2, rank=0)
    second = costlab.track(exp.pk, "ddp", run_key="job-7", device="cpu", world_size=2, rank=1)
    with first, second:
        first.log(tokens=5)
        second.log(tokens=5)
    assert first.run_id == second.run_id
    ranks = set(TelemetrySample.objects.filter(run_id=first.run_id).values_list("rank", flat=True))
    assert ranks == {0, 1}
    row = Run.objects.get(pk=first.run_id)
    assert (row.status, row.world_size, row.tokens) == ("succeeded", 2, 10)  # 5 x 2 ranks
    with pytest.raises(Exception, match="already succeeded"):
        costlab.track(exp.pk, "ddp", run_key="job-7", device="cpu").start()


def test_an_outage_at_the_start_spools_and_resend_delivers_it(served, tmp_path, monkeypatch):
    """The site is down when training starts: the run goes on offline, its samples spool, the end
    leaves them with how it ended; resend creates the run (from the start time) and ends it."""
    from costlab import run as sdk_run
    from costlab.resend import resend

    monkeypatch.setattr(sdk_run, "START_WAIT_S", 0.5)
    down = f"http://127.0.0.1:{free_port()}"
    with costlab.track(
        served["experiment"].pk,
        "candidate",
        url=down,
        interval_s=0.05,
        buffer_size=2,
        flush_timeout_s=0.5,
        spool_dir=tmp_path,
        device="cpu",
        **HELD,
    ) as run:
        for _ in range(10):
            run.log(tokens=50)
        time.sleep(0.3)
    assert run.run_id is None and run.samples_left == run.samples > 2
    pending = json.loads((run.spool_path / "pending.json").read_text())
    assert pending["finish"] == {"status": "succeeded", "error": ""}
    done = resend(run.spool_path, url=served["url"])
    assert done["sent"] == run.samples and done["status"] == "succeeded"
    assert not run.spool_path.exists()
    row = Run.objects.get(pk=done["run_id"])
    assert row.run_key == run.run_key and row.tokens == 500 and row.cost_usd > 0
    assert stored_seqs(row.pk) == list(range(run.samples))


def test_the_sdk_sends_at_the_servers_cadence_unless_its_caller_set_one(served, settings):
    """A fleet's operator sets COSTLAB_TELEMETRY_SEND_EVERY_S once; every run's SDK follows it
    (it comes with the created run), and a caller's own send_every_s wins."""
    exp = served["experiment"]
    with costlab.track(exp.pk, "control", device="cpu", **HELD) as run:
        assert run.send_every_s == SEND_EVERY_S == 2.0  # no cadence set: its own
    settings.COSTLAB_TELEMETRY_SEND_EVERY_S = 45.0
    with costlab.track(exp.pk, "control", device="cpu", **HELD) as run:
        assert run.send_every_s == 45.0 and run._sender.every_s == 45.0
        run.log(step=1, tokens=10)
    assert stored_seqs(run.run_id) == list(range(run.samples))  # the end still flushes all
    with costlab.track(exp.pk, "control", device="cpu", send_every_s=0.5, **HELD) as run:
        assert run.send_every_s == 0.5 and run._sender.every_s == 0.5


def test_a_second_sampler_of_one_rank_in_a_process_is_refused_before_it_starts(served):
    """`track(assign=True, run_key=K).start()` and then a callback given K used to stream the
    same seqs twice; the second is refused at its start, naming the fix."""
    exp = served["experiment"]
    with costlab.track(exp.pk, "control", run_key="job-9", device="cpu") as first:
        second = costlab.track(exp.pk, "control", run_key="job-9", device="cpu")
        with pytest.raises(RuntimeError, match=r"already tracked in this process.*CostlabCallback"):
            second.start()
        first.log(tokens=3)
    assert Run.objects.get(pk=first.run_id).status == "succeeded"


def test_an_unknown_experiment_is_named_as_such(served):
    with pytest.raises(costlab.Refused, match="there is no experiment 999999"):
        costlab.track(999999, "a", device="cpu").start()
