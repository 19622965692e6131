"""The one leased-job lifecycle, on the real database: a run and a sweep's probe are claimed,
renewed, swept when their worker went silent and sent again when unclaimed by the same code."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core import leases
from apps.experiments import runs
from apps.experiments.models import Run
from apps.sweeps import probes
from apps.sweeps.models import Probe, Sweep
from tests.factories import RunFactory, TenantFactory

pytestmark = pytest.mark.django_db

JOBS = {"run": runs.RUN_LEASE, "probe": probes.PROBE_LEASE}


def queued(kind: str):
    """A queued job of this kind, as its submit leaves it (never sent)."""
    if kind == "run":
        return RunFactory(status="queued")
    sweep = Sweep.objects.create(
        tenant=TenantFactory(),
        name="s",
        base_strategy_yaml="model: {preset: tiny}\n",
        space={"model.seq_len": [16]},
        sampler="grid",
        probe_count=1,
        probe_steps=2,
    )
    return Probe.objects.create(
        sweep=sweep, number=0, params={}, params_key="k", strategy_yaml="model: {preset: tiny}\n"
    )


def silence(kind: str, job_id: int) -> None:
    """Its worker stopped renewing: a run's deadline passed, a probe's heartbeat grew old."""
    if kind == "run":
        Run.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    else:
        old = timezone.now() - timedelta(seconds=settings.COSTLAB_PROBE_LOST_AFTER_S + 1)
        Probe.objects.filter(pk=job_id).update(heartbeat_at=old)


@pytest.mark.parametrize("kind", JOBS)
def test_a_claim_by_a_second_owner_is_refused_and_only_the_owner_renews(kind):
    job, row = JOBS[kind], queued(kind)
    claimed = leases.lease_claim(job, pk=row.pk, owner="w1")
    assert claimed is not None and claimed.status == "running"
    assert getattr(claimed, job.owner_field) == "w1" and claimed.heartbeat_at is not None
    assert leases.lease_claim(job, pk=row.pk, owner="w2") is None
    again = leases.lease_claim(job, pk=row.pk, owner="w1")  # its answer was lost: same claim
    assert again is not None and again.pk == row.pk
    assert leases.lease_claim(job, pk=999_999, owner="w2") is None
    assert not leases.lease_renew(job, pk=row.pk, owner="w2")
    before = type(row).objects.get(pk=row.pk).heartbeat_at
    assert leases.lease_renew(job, pk=row.pk, owner="w1")
    assert type(row).objects.get(pk=row.pk).heartbeat_at > before
    with transaction.atomic():
        assert leases.lease_held_locked(job, pk=row.pk, owner="w2") is None
        assert leases.lease_held_locked(job, pk=row.pk, owner="w1").pk == row.pk


def test_expired_leases_of_a_run_and_of_a_probe_are_swept_by_the_same_code():
    expired = {kind: queued(kind) for kind in JOBS}
    fresh = {kind: queued(kind) for kind in JOBS}
    for kind, job in JOBS.items():
        for row in (expired[kind], fresh[kind]):
            assert leases.lease_claim(job, pk=row.pk, owner=f"{kind}-worker") is not None
        silence(kind, expired[kind].pk)
    for kind, job in JOBS.items():
        seen = []
        assert leases.leases_sweep_expired(job, lost=seen.append) == [expired[kind].pk]
        assert [row.pk for row in seen] == [expired[kind].pk]  # handed over with its row
    # A probe claimed before its first heartbeat is aged from its claim.
    Probe.objects.filter(pk=fresh["probe"].pk).update(
        heartbeat_at=None, started_at=timezone.now() - timedelta(days=1)
    )
    assert leases.leases_sweep_expired(probes.PROBE_LEASE, lost=lambda row: None) == [
        expired["probe"].pk,
        fresh["probe"].pk,
    ]


def test_the_runs_sweeper_and_the_probes_reconciler_both_go_through_the_shared_lease(
    monkeypatch,
):
    swept, resent = [], []
    sweep, resend = leases.leases_sweep_expired, leases.leases_resend_unclaimed

    def sweep_spy(job, **kwargs):
        swept.append(job.name)
        return sweep(job, **kwargs)

    def resend_spy(job, **kwargs):
        resent.append(job.name)
        return resend(job, **kwargs)

    monkeypatch.setattr(leases, "leases_sweep_expired", sweep_spy)
    monkeypatch.setattr(leases, "leases_resend_unclaimed", resend_spy)
    run, probe = queued("run"), queued("probe")
    runs.run_claim(run_id=run.pk, owner="w1")
    probes.probe_claim(probe_id=probe.pk, owner="w1")
    silence("run", run.pk)
    assert runs.runs_sweep_lost() == [run.pk]
    runs.runs_reconcile_queued()
    assert probes.probes_reconcile(now=timezone.now())["resent"] == []
    assert swept == ["run", "probe"] and resent == ["run", "probe"]


def test_unclaimed_jobs_are_sent_again_once_they_waited_long_enough():
    kinds = {kind: queued(kind) for kind in JOBS}
    for kind, job in JOBS.items():
        row, sent = kinds[kind], []
        waited = timezone.now() + timedelta(seconds=job.resend_after_s() + 6)
        assert leases.leases_resend_unclaimed(job, send=sent.append) == []  # its send in flight
        assert leases.leases_resend_unclaimed(job, send=sent.append, now=waited) == [row.pk]
        leases.lease_sent(job, pk=row.pk)
        assert leases.leases_resend_unclaimed(job, send=sent.append) == []  # just sent
        later = waited + timedelta(days=1)
        refused = leases.leases_resend_unclaimed(job, send=lambda _: False, now=later)
        assert refused == []  # the broker refused it: due again next beat
        assert leases.lease_claim(job, pk=row.pk, owner="w1") is not None
        assert leases.leases_resend_unclaimed(job, send=sent.append, now=later) == []  # claimed
        assert [r["pk"] for r in sent] == [row.pk]
