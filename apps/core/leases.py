"""One lifecycle for every kind of leased job (a run, a sweep's probe): the row is the truth.

A job is queued in its row and its id sent to a queue; the message only wakes a worker.
- A worker claims the row under a lease (status running, its owner id); a claim by anyone else
  is refused, so a duplicate message is harmless, and a claim repeated by its owner (the answer
  lost with the connection) returns the same row.
- The owner's heartbeat keeps the lease fresh. A worker that dies (killed, out of memory, its host
  gone) stops renewing; the beat's sweep hands each job whose lease expired to the kind's own rule.
- The beat also sends again the queued jobs that no worker claimed: the broker was down at submit,
  or lost the message.

Only the mechanics live here, parameterised by a LeasedJob (the model, its status values and the
fields that hold the lease). What a claim may refuse or open (attempts, a sweep that stopped) and
what a lost job becomes (requeued or failed, infeasible) stay with the kind:
apps.experiments.runs and apps.sweeps.probes.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

logger = logging.getLogger(__name__)

RESEND_BACKOFF_CAP = 4  # a job sent n times waits resend_after x 2^(n-1), at most x 16


@dataclass(frozen=True)
class LeasedJob:
    """Where one kind of leased job keeps its lease in its row (its status field is `status`).

    The seconds are read from settings at each call, by name, so a deployment (or a test) that
    changes them is obeyed at once.
    """

    name: str  # in log lines: "run", "probe"
    model: type[models.Model]
    queued: str
    running: str
    owner_field: str  # the holder's owner id (lease_owner_id)
    heartbeat_field: str  # renewed by the holder
    lost_after_setting: str  # seconds without a renewal after which the lease is lost
    resend_after_setting: str  # seconds a sent, unclaimed job waits before it is sent again
    # A stored deadline, written at claim and at each renewal (the worker may ask a longer lease);
    # None: the heartbeat's age decides.
    expires_field: str | None = None
    claimed_field: str | None = None  # a job that never beat is aged from its claim
    sent_field: str = "sent_at"
    sends_field: str | None = None  # sends counted: each re-send waits twice as long
    unsent_since_field: str = "created_at"  # a job never sent is aged from this
    # A job never sent waits min(this, resend_after): its own send, after commit, is in flight.
    unsent_grace_s: float | None = None
    touched_field: str | None = None  # an auto_now field saved with the claim
    scope: Q = field(default_factory=Q)  # the rows the beat looks at (an external run never is)

    def lost_after_s(self) -> float:
        return float(getattr(settings, self.lost_after_setting))

    def resend_after_s(self) -> float:
        return float(getattr(settings, self.resend_after_setting))


def lease_owner_id(host: str | None = None) -> str:
    """A worker process's name on the leases it takes: host, pid and a nonce (a pid is reused)."""
    return f"{host or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_held(job: LeasedJob, *, pk: int, owner: str) -> QuerySet:
    """The job while it is running under this owner's lease (empty once swept, released or
    ended)."""
    return job.model.objects.filter(pk=pk, status=job.running, **{job.owner_field: owner})


def lease_held_locked(job: LeasedJob, *, pk: int, owner: str) -> Any:
    """The job, locked for update, while it is still running under this owner's lease; None when
    it is not ours any more. Call it inside a transaction."""
    return lease_held(job, pk=pk, owner=owner).select_for_update(of=("self",)).first()


@transaction.atomic
def lease_claim(
    job: LeasedJob,
    *,
    pk: int,
    owner: str,
    lease_s: float | None = None,
    related: Iterable[str] = (),
    admit: Callable[[Any], bool] | None = None,
    opened: Callable[[Any, datetime], Iterable[str]] | None = None,
) -> Any:
    """Take a queued job for this owner; None when it is gone, taken, or refused by admit.

    related: relations read with the row (not locked). admit(row) is the kind's rule, asked with
    the row locked; it may end the job itself (a cancelled run) and answers whether to take it.
    opened(row, now) sets the kind's own fields of a new claim and names them, to be saved with
    the lease. Repeating a claim that committed (its answer lost with the connection) returns the
    same row, and opens nothing again.
    """
    rows = job.model.objects.select_for_update(of=("self",))
    related = tuple(related)
    if related:  # select_related() with no names would follow every relation
        rows = rows.select_related(*related)
    row = rows.filter(pk=pk).first()
    if row is not None and row.status == job.running and getattr(row, job.owner_field) == owner:
        return row
    if row is None or row.status != job.queued or (admit is not None and not admit(row)):
        return None
    now = timezone.now()
    row.status = job.running
    setattr(row, job.owner_field, owner)
    fields = ["status", job.owner_field, *_lease_stamp(job, row, now=now, lease_s=lease_s)]
    if opened is not None:
        fields += list(opened(row, now))
    if job.touched_field:
        fields.append(job.touched_field)
    row.save(update_fields=list(dict.fromkeys(fields)))
    return row


def _lease_stamp(job: LeasedJob, row: Any, *, now: datetime, lease_s: float | None) -> list[str]:
    """Set the heartbeat (and the deadline, where the kind stores one) on row; the fields set."""
    setattr(row, job.heartbeat_field, now)
    if job.expires_field is None:
        return [job.heartbeat_field]
    lease = timedelta(seconds=lease_s or job.lost_after_s())
    setattr(row, job.expires_field, now + lease)
    return [job.heartbeat_field, job.expires_field]


def lease_renew(
    job: LeasedJob, *, pk: int, owner: str, lease_s: float | None = None, where: Q | None = None
) -> bool:
    """The heartbeat: renew the lease; False when the job is not ours any more (swept or ended),
    or no longer matches `where` (the kind's reason to stop, e.g. its sweep ended)."""
    now = timezone.now()
    values = {job.heartbeat_field: now}
    if job.expires_field is not None:
        lease = timedelta(seconds=lease_s or job.lost_after_s())
        values[job.expires_field] = now + lease
    rows = lease_held(job, pk=pk, owner=owner)
    if where is not None:
        rows = rows.filter(where)
    return bool(rows.update(**values))


def _expired(job: LeasedJob, now: datetime) -> Q:
    if job.expires_field is not None:
        return Q(**{f"{job.expires_field}__lt": now})
    before = now - timedelta(seconds=job.lost_after_s())
    lost = Q(**{f"{job.heartbeat_field}__lt": before})
    if job.claimed_field is not None:
        lost |= Q(**{f"{job.heartbeat_field}__isnull": True, f"{job.claimed_field}__lt": before})
    return lost


def leases_sweep_expired(
    job: LeasedJob, *, lost: Callable[[Any], None], now: datetime | None = None
) -> list[int]:
    """Beat: hand each running job whose lease expired to lost(row), the kind's rule; their ids.

    Each job is settled in its own transaction with its row locked, its expiry checked again under
    the lock; a row another transaction holds (its owner finishing it this very moment) is skipped,
    and the next beat sees it again if it is still expired.
    """
    now = now or timezone.now()
    expired = job.model.objects.filter(job.scope, _expired(job, now), status=job.running)
    swept = []
    for pk in list(expired.order_by("pk").values_list("pk", flat=True)):
        with transaction.atomic():
            row = expired.filter(pk=pk).select_for_update(of=("self",), skip_locked=True).first()
            if row is None:
                continue
            logger.warning(
                "%s %s lost: its owner %s stopped renewing its lease (last heartbeat %s)",
                job.name,
                pk,
                getattr(row, job.owner_field) or "?",
                _when(getattr(row, job.heartbeat_field)),
            )
            lost(row)
            swept.append(pk)
    return swept


def lease_sent(job: LeasedJob, *, pk: int) -> None:
    """Record that the job's id reached the broker (and count it, where the kind counts sends)."""
    values: dict[str, Any] = {job.sent_field: timezone.now()}
    if job.sends_field is not None:
        values[job.sends_field] = F(job.sends_field) + 1
    job.model.objects.filter(pk=pk).update(**values)


def leases_resend_unclaimed(
    job: LeasedJob,
    *,
    send: Callable[[dict[str, Any]], bool | None],
    fields: Iterable[str] = (),
    where: Q | None = None,
    now: datetime | None = None,
    limit: int = 1000,
) -> list[int]:
    """Beat: send again the queued jobs that no worker claimed, never sent or sent long enough
    ago; the ids sent.

    send(row) gets a dict of the row's pk and `fields` and publishes it (recording it with
    lease_sent); it answers False when the broker refused it, which leaves the job due for the
    next beat. `where` is the kind's rule for which queued jobs are still wanted. Where the kind
    counts sends, a job sent n times waits resend_after x 2^(n-1) (at most x 16) before the next
    send, so a job merely waiting behind busy workers gets a few harmless duplicates, not a flood.
    """
    now = now or timezone.now()
    after = timedelta(seconds=job.resend_after_s())
    unsent_after = after
    if job.unsent_grace_s is not None:
        unsent_after = min(after, timedelta(seconds=job.unsent_grace_s))
    never_sent = {
        f"{job.sent_field}__isnull": True,
        f"{job.unsent_since_field}__lt": now - unsent_after,
    }
    due = job.model.objects.filter(job.scope, status=job.queued).filter(
        Q(**never_sent) | Q(**{f"{job.sent_field}__lt": now - after})
    )
    if where is not None:
        due = due.filter(where)
    sends = [job.sends_field] if job.sends_field is not None else []
    resent = []
    for row in due.order_by("pk").values("pk", job.sent_field, *sends, *fields)[:limit]:
        sent_at = row[job.sent_field]
        if sent_at is not None and sends:
            waits = 2 ** min(max(row[job.sends_field] - 1, 0), RESEND_BACKOFF_CAP)
            if now - sent_at < after * waits:
                continue
        logger.info(
            "%s %s: queued with no claim (last sent %s); sending it again",
            job.name,
            row["pk"],
            _when(sent_at, never="never"),
        )
        if send(row) is not False:
            resent.append(row["pk"])
    return resent


def _when(at: datetime | None, never: str = "none") -> str:
    return at.isoformat() if at is not None else never
