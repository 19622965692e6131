"""A probe's life: proposed (Optuna's next point, while the sweep's budget and parallelism
allow), sent to its queue at batch priority, claimed by a worker, kept alive by its heartbeat,
measured and priced by the bill a run's samples are priced by, finished, and, when its worker is
lost or its message never arrived, settled or sent again by the reconciler. The lease's mechanics
(claim, heartbeat, the sweep of lost probes, the resend of unclaimed ones) are apps.core.leases',
the ones a run's lease uses. The sweep's own writes (create, cancel, promote) are
apps.sweeps.services."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import yaml
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.billing.interface import cost_per_million_tokens, samples_bill
from apps.core import leases
from apps.core.queues import TaskName, task_send
from apps.experiments.models import Run
from apps.experiments.strategies import strategy_validate
from apps.sweeps.measure import peak_memory_mb, timed_stretch
from apps.sweeps.models import Probe, Sweep
from apps.sweeps.proposer import Known, propose
from apps.sweeps.pruning import space_pruned
from apps.sweeps.quality import CONSTRAINT_REASON, EVAL_LOSS, held_out_loss, in_space, judge
from apps.sweeps.space import RESOURCE_KEYS, params_key, space_expand, strategy_with

logger = logging.getLogger(__name__)

PROBE_TASK = TaskName.SWEEP_PROBE

# A probe's lease: lost after COSTLAB_PROBE_LOST_AFTER_S without a heartbeat (from its claim if it
# never beat); a queued probe no worker took within COSTLAB_PROBE_RESEND_AFTER_S is sent again.
PROBE_LEASE = leases.LeasedJob(
    name="probe",
    model=Probe,
    queued=Probe.Status.QUEUED,
    running=Probe.Status.RUNNING,
    owner_field="worker",
    heartbeat_field="heartbeat_at",
    lost_after_setting="COSTLAB_PROBE_LOST_AFTER_S",
    resend_after_setting="COSTLAB_PROBE_RESEND_AFTER_S",
    claimed_field="started_at",
    unsent_since_field="created_at",
)
SWEEP_RUNNING = Q(sweep__status=Sweep.Status.RUNNING)


def base_document(base_strategy_yaml: str) -> dict[str, Any]:
    from gpu_runtime.yaml_loader import read_strategy_yaml

    strategy_validate(base_strategy_yaml, field="base_strategy_yaml")
    return read_strategy_yaml(base_strategy_yaml)


def candidate_yaml(base: dict[str, Any], params: dict[str, Any]) -> str:
    return yaml.safe_dump(strategy_with(base, params), sort_keys=False)


def base_params(base: dict[str, Any], expanded: dict[str, list[Any]]) -> dict[str, Any]:
    """The base strategy's own value of each searched key (its default where the document leaves
    the key out); a key it sets no value for (``resources.threads``: the machine's) is left out."""
    from gpu_runtime import strategy_from_dict

    config = strategy_from_dict(base)
    params = {}
    for key in expanded:
        if key in RESOURCE_KEYS:
            continue
        node: Any = config
        for part in key.split("."):
            node = getattr(node, part, None)
        if node is not None:
            params[key] = node
    return params


def _known(sweep: Sweep, expanded: dict[str, list[Any]]) -> list[Known]:
    known = []
    for probe in sweep.probes.order_by("number"):
        if probe.is_base and not in_space(probe.params, expanded):
            continue  # the base outside the space: a reference for quality, not a trial
        values = probe.objective_values(sweep.objectives)
        if probe.status == Probe.Status.SUCCEEDED and all(v is not None for v in values):
            state = "complete"
        else:
            state = "running" if probe.status in Probe.PENDING else "fail"
        known.append(
            Known(
                params=probe.params,
                state=state,
                values=values if state == "complete" else None,
                attrs=probe.sampler_attrs,
            )
        )
    return known


def probe_next(sweep: Sweep, base: dict[str, Any], expanded: dict[str, list[Any]]) -> Probe | None:
    """Ask Optuna for the next point and queue its probe (on commit);
    None when the space is exhausted."""
    proposal = propose(
        sampler=sweep.sampler,
        seed=sweep.seed,
        expanded=expanded,
        directions=len(sweep.objectives),
        probe_count=sweep.probe_count,
        known=_known(sweep, expanded),
    )
    if proposal is None:
        return None
    params = proposal.params
    probe = Probe.objects.create(
        sweep=sweep,
        number=sweep.probes.count(),
        params=params,
        params_key=params_key(params),
        strategy_yaml=candidate_yaml(base, params),
        sampler_attrs=proposal.attrs,
    )
    _send_on_commit(probe)
    return probe


def probe_base(sweep: Sweep, base: dict[str, Any], params: dict[str, Any]) -> Probe:
    """Queue the base strategy itself as the sweep's first probe (on commit): the reference each
    candidate's held-out loss is judged against. ``params`` are the base's values of the searched
    keys: when they are a point of the space, Optuna is told it as that point's trial (as
    ``enqueue_trial`` would), and never proposes it again."""
    probe = Probe.objects.create(
        sweep=sweep,
        number=sweep.probes.count(),
        params=params,
        params_key=params_key(params),
        strategy_yaml=candidate_yaml(base, {}),
        is_base=True,
    )
    _send_on_commit(probe)
    return probe


def _send_on_commit(probe: Probe) -> None:
    probe_id, queue = probe.pk, probe.sweep.queue
    transaction.on_commit(lambda: probe_send(probe_id=probe_id, queue=queue), robust=True)


def probe_send(*, probe_id: int, queue: str) -> bool:
    """Publish the probe's id at batch priority (a ci or normal run waiting on the same queue is
    taken first); False when the broker is down (logged), and the reconciler sends it later."""
    level = Run.PRIORITY_LEVEL[Run.Priority.BATCH]
    if not task_send(PROBE_TASK, args=[probe_id], queue=queue, priority=level):
        return False
    leases.lease_sent(PROBE_LEASE, pk=probe_id)
    return True


def probe_claim(*, probe_id: int, owner: str) -> Probe | None:
    """Take a queued probe of a running sweep; None when it is gone, taken or cancelled.

    A claim repeated after it committed (its answer lost with the connection) returns the probe."""

    def started(probe: Probe, now) -> list[str]:
        probe.started_at = now
        return ["started_at"]

    return leases.lease_claim(
        PROBE_LEASE,
        pk=probe_id,
        owner=owner,
        related=("sweep", "sweep__tenant"),
        admit=lambda probe: probe.sweep.status == Sweep.Status.RUNNING,
        opened=started,
    )


def _as_datetime(sample: dict[str, Any]) -> dict[str, Any]:
    ts = sample["ts"]
    return {**sample, "ts": ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, tz=UTC)}


def _measure(
    probe: Probe,
    *,
    samples: list[dict],
    result: Any,
    device: str,
    gpu_count: int,
    vcpus: int,
    baseline_mem_mb: float,
) -> None:
    """Fill the probe's measured fields, its timed samples priced by the bill a run's samples
    are priced by (apps.billing.interface.samples_bill: an interval split at a price boundary,
    board power modelled from the SKU where nothing was measured)."""
    sweep = probe.sweep
    timed = timed_stretch(samples, warmup_steps=sweep.warmup_steps)
    if timed is None:
        probe.status = Probe.Status.INFEASIBLE
        probe.reason = (
            "probe_steps: too few steps were timed "
            f"after the {sweep.warmup_steps} warm-up steps to "
            f"measure anything; raise probe_steps"
        )
        return
    bill = samples_bill(
        samples=[_as_datetime(s) for s in timed.samples],
        after=_as_datetime(timed.boundary),
        tenant_id=sweep.tenant_id,
        gpu_sku=sweep.gpu_sku,
        cost_model=sweep.cost_model,
        gpu_count=gpu_count,
        vcpus=vcpus,
        as_of=probe.created_at,
    )
    usage, cost = bill.usage, bill.cost
    cuda = device.startswith("cuda")
    probe.status = Probe.Status.SUCCEEDED
    probe.steps_timed, probe.step_time_s, probe.step_time_spread = (
        timed.steps,
        timed.step_time_s,
        timed.step_time_spread,
    )
    probe.tokens_per_s = timed.tokens_per_s
    probe.peak_mem_mb = peak_memory_mb(
        samples, result.peak_mem_mb, cuda=cuda, baseline_mb=baseline_mem_mb
    )
    probe.mem_estimated = not cuda
    probe.energy_j, probe.energy_estimated = usage.energy_j, bool(result.energy_estimated)
    probe.cost_usd = Decimal(f"{cost.total_usd:.9f}")
    probe.usd_per_mtok = cost_per_million_tokens(cost.total_usd, usage.tokens)
    probe.final_loss = result.final_loss
    # read defensively: a runtime without evaluation hands back no eval_loss at all
    probe.eval_loss, probe.eval_s = held_out_loss(result, samples)
    if probe.eval_loss is not None and not math.isfinite(probe.eval_loss):
        probe.status = Probe.Status.INFEASIBLE
        probe.reason = f"eval_loss: the held-out loss is {probe.eval_loss} (the candidate diverged)"
        probe.eval_loss = None
    elif probe.eval_loss is None and EVAL_LOSS in sweep.objectives:
        probe.status = Probe.Status.INFEASIBLE
        probe.reason = "eval_loss: the probe reported no held-out loss (an objective of the sweep)"


def sweep_quality_apply(*, sweep: Sweep) -> list[int]:
    """Under the sweep's quality_margin, each measured candidate whose held-out loss is more than
    the margin above the base's, or not measured on either side, becomes infeasible with the
    reason; nothing is judged before the base's probe has landed. Runs as each probe lands (the
    base may land after others); returns the ids it made infeasible."""
    if sweep.quality_margin is None:
        return []
    base = sweep.probes.filter(is_base=True).first()
    if base is None or base.status in Probe.PENDING:
        return []
    missing = base_missing(base)
    excluded = []
    for probe in sweep.probes.filter(status=Probe.Status.SUCCEEDED, is_base=False):
        judgement = judge(
            eval_loss=probe.eval_loss,
            base_eval_loss=None if missing else base.eval_loss,
            margin=sweep.quality_margin,
            margin_from="the sweep's quality_margin",
            base_missing=missing,
        )
        if not judgement.acceptable:
            probe.status = Probe.Status.INFEASIBLE
            probe.reason = CONSTRAINT_REASON + judgement.detail
            probe.save(update_fields=["status", "reason"])
            excluded.append(probe.pk)
    return excluded


def base_missing(base: Probe | None) -> str:
    """Why the base has no held-out loss to judge by, in words ("" when its probe succeeded):
    e.g. "its probe #0 is infeasible: out of memory: ..." (the reason's first line)."""
    if base is None:
        return "the sweep has no probe of its base"
    if base.status == Probe.Status.SUCCEEDED:
        return ""
    why = base.reason.splitlines()[0][:200] if base.reason else ""
    return f"its probe #{base.number} is {base.status}" + (f": {why}" if why else "")


@transaction.atomic
def probe_finish(
    *,
    probe_id: int,
    owner: str,
    samples: list[dict] | None = None,
    result: Any = None,
    error: str = "",
    cancelled: bool = False,
    device: str = "",
    gpu_count: int = 0,
    vcpus: int = 0,
    baseline_mem_mb: float = 0.0,
) -> Probe | None:
    """Record a probe's end (measured, infeasible with the reason, or cancelled) and queue
    the next one."""
    probe = leases.lease_held_locked(PROBE_LEASE, pk=probe_id, owner=owner)
    if probe is None:
        return None
    sweep = Sweep.objects.select_for_update().get(pk=probe.sweep_id)
    probe.sweep = sweep
    probe.device, probe.finished_at = device, timezone.now()
    if cancelled or sweep.status == Sweep.Status.CANCELLED:
        probe.status = Probe.Status.CANCELLED
    elif error:
        probe.status, probe.reason = Probe.Status.INFEASIBLE, error[:4000]
    else:
        _measure(
            probe,
            samples=samples or [],
            result=result,
            device=device,
            gpu_count=gpu_count,
            vcpus=vcpus,
            baseline_mem_mb=baseline_mem_mb,
        )
    probe.save()
    sweep_quality_apply(sweep=sweep)
    if sweep.status == Sweep.Status.RUNNING:
        sweep_advance(sweep=sweep)
    return probe


def sweep_advance(*, sweep: Sweep) -> None:
    """Queue probes up to the parallelism while the budget lasts;
    close the sweep when all have landed."""
    probes = sweep.probes.count()
    pending = sweep.probes.filter(status__in=Probe.PENDING).count()
    exhausted = False
    if probes < sweep.probe_count and pending < sweep.parallelism:
        base = base_document(sweep.base_strategy_yaml)
        expanded = space_pruned(space_expand(sweep.space), sweep.pruned)
        for _ in range(min(sweep.parallelism - pending, sweep.probe_count - probes)):
            if probe_next(sweep, base, expanded) is None:
                exhausted = True
                break
            pending += 1
    if pending == 0:
        sweep.status, sweep.finished_at = Sweep.Status.COMPLETED, timezone.now()
        if exhausted:
            sweep.note = "every point of the space was probed before the budget was spent"
        sweep.save(update_fields=["status", "finished_at", "note", "updated_at"])


def probe_heartbeat(*, probe_id: int, owner: str) -> bool:
    """Renew a running probe's heartbeat; True when it should stop
    (its sweep ended, or it is no longer ours)."""
    return not leases.lease_renew(PROBE_LEASE, pk=probe_id, owner=owner, where=SWEEP_RUNNING)


def probes_reconcile(*, now=None) -> dict[str, list[int]]:
    """Beat: a running probe whose worker stopped renewing it is infeasible (lost), and its sweep
    goes on; a queued probe of a running sweep whose message never reached a worker is sent
    again."""
    lost = leases.leases_sweep_expired(PROBE_LEASE, lost=_probe_lost, now=now)
    resent = leases.leases_resend_unclaimed(
        PROBE_LEASE,
        # looked up at each call: a stand-in send (tests, the benchmark) replaces probe_send
        send=lambda row: probe_send(probe_id=row["pk"], queue=row["sweep__queue"]),
        fields=("sweep__queue",),
        where=SWEEP_RUNNING,
        now=now,
    )
    return {"lost": lost, "resent": resent}


def _probe_lost(probe: Probe) -> None:
    """What an expired lease means for a probe (its row locked by the sweep): infeasible, with
    the reason, and its sweep goes on."""
    probe_finish(
        probe_id=probe.pk,
        owner=probe.worker,
        error=(
            f"lost: its worker ({probe.worker}) stopped renewing it for "
            f"{settings.COSTLAB_PROBE_LOST_AFTER_S:g} s "
            "(killed, or the host ran out of memory)"
        ),
    )
