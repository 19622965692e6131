"""A tracked run: created (or joined) on the server by its run key, sampled on a daemon thread,
delivered in the background, and finished with how the training ended.

    with costlab.track(experiment=12, arm="bf16") as run:
        for step, batch in enumerate(loader):
            loss = train_step(batch)
            run.log(tokens=batch["input_ids"].numel(), loss=loss)
            if step % 500 == 0:
                run.log_eval(eval_loss=evaluate(model, held_out))

Every call to the server is safe to repeat (the run key, sticky assignment, seq), so each is
retried through an outage. What the training thread does, ``log()``, touches neither the network
nor the disk nor a lock: it replaces one tuple. ``log_eval()`` checks its numbers and queues one
evaluation, sent as a sample of its own; so do ``log_metrics()`` (training metrics at a step: loss,
grad_norm, learning_rate ...) and ``log_params()`` (the hyperparameters, the model's config).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from costlab.client import Client, Unreachable
from costlab.delivery import Outbox, Refused, Sender, Spool, default_spool_root, say
from costlab.evaluation import evaluation_fields
from costlab.exits import open_runs, outcome_of, watch
from costlab.metrics import (
    MAX_PARAMS_BYTES,
    MAX_QUEUED,
    metrics_checked,
    params_checked,
    step_checked,
)
from costlab.probes import open_probe
from costlab.resend import PENDING
from costlab.sampler import Evaluation, Progress, Sampler
from costlab.world import World, run_key_for

# The run is created on the sender thread; the start waits this long for that first answer (a
# refusal is raised there), then training goes on and the run is created when the site answers.
START_WAIT_S = 1.0
ASSIGN_WAIT_S = 60.0  # an assignment is needed before training: waited for longer, then raised
FINISH_WAIT_S = 30.0  # ending a run whose every sample the site just took
OUTAGE_PATIENCE_S = 5.0  # at the end, an outage that begins while delivering is waited this long
SEND_EVERY_S = 2.0  # between deliveries, unless the caller or the server says otherwise
ONLINE, OFFLINE, DISABLED = MODES = ("online", "offline", "disabled")


def resolve_mode(given: str | None) -> str:
    """`mode=`, else COSTLAB_MODE, else online: online (deliver as it trains), offline (never
    contact the server: every sample to the spool, for `python -m costlab resend DIR` later),
    disabled (do nothing at all)."""
    raw = os.environ.get("COSTLAB_MODE", "") if given is None else given
    mode = str(raw).strip().lower() or ONLINE
    if mode not in MODES:
        raise ValueError(
            f"COSTLAB_MODE (or mode=): {raw!r} is not a mode; use one of {', '.join(MODES)}"
        )
    return mode


def refuse_a_second_sampler(run: Run) -> None:
    """One sampler per (run key, rank) in a process: a second would stream the same seqs, and the
    server would keep whichever came first. Raised before anything starts, naming the fix."""
    for other in list(open_runs):
        if (
            other is not run
            and not other.closed
            and other.run_key == run.run_key
            and other.rank == run.rank
            and other.experiment == run.experiment
        ):
            raise RuntimeError(
                f"run_key: '{run.run_key}' rank {run.rank} is already tracked in this process "
                f"(run {other.run_id}); hand that run on instead of starting a second sampler: "
                "CostlabCallback(run=run), or the run's own log()"
            )


def track(experiment: int, arm: str | int | None = None, **options: Any) -> Run:
    """A Run of `experiment` on `arm` (a name or an id; None: the server routes by weight, or
    `assign=True`: the server assigns it, sticky per run key). Use it as a context manager:
    it starts on entry and finishes on exit, `succeeded`, `failed` on an exception (re-raised)
    or `cancelled` on KeyboardInterrupt. Options: those of `Run`."""
    return Run(experiment, arm, **options)


class Run:
    """One external run's telemetry stream from this process (this rank).

    experiment, arm, assign, run_key: which run (the ranks of one job pass the same run_key, or
    share torchrun's job id, and so share one run). url, token: default COSTLAB_URL and
    COSTLAB_TOKEN. interval_s: seconds between samples (default 1, or the assigned arm's
    telemetry.interval_s). gpu_sku (a name the server knows), gpu_count, vcpus, memory_gb: what
    the job holds, priced per hour (None: not declared). resource_id: the cloud resource it
    trains on, as the invoice's FOCUS ResourceId names it (default COSTLAB_RESOURCE_ID; the
    server's billing reconciliation matches it to the invoice). device: this rank's device ("cpu",
    "cuda:N", a GPU UUID; default: the local rank's visible GPU, else the CPU). rank, local_rank,
    world_size: default RANK, LOCAL_RANK, WORLD_SIZE. spool_dir: where samples the server cannot
    take yet wait, in a subfolder per run key and rank, made only if needed (default:
    COSTLAB_SPOOL_DIR, else the user's cache folder: $XDG_CACHE_HOME/costlab/spool or
    ~/.cache/costlab/spool; never the system temp folder). buffer_size: samples
    held in memory before the spool. barrier: called by every rank between its last delivery and
    rank 0's finish (e.g. torch.distributed.barrier), so no rank's last samples arrive after the
    run ended. flush_timeout_s: how long the end waits for delivery. send_every_s: seconds between
    deliveries (default: the server's telemetry_send_every_s, answered when the run is created,
    else 2). mode: default COSTLAB_MODE, else "online"; "offline" never contacts the server (every
    sample goes to the spool, and `python -m costlab resend DIR` creates, fills and ends the run
    later; not with assign=True), "disabled" does nothing at all (no thread, no file, no request).

    Neither end waits long on a site that is down: the run is created on the sender thread (the
    start waits START_WAIT_S, 1 s, for that answer), and where the site is failing at the end the
    rest goes to the spool at once, with how the run ended, for `python -m costlab resend DIR`.
    """

    def __init__(
        self,
        experiment: int,
        arm: str | int | None = None,
        *,
        assign: bool = False,
        run_key: str | None = None,
        url: str | None = None,
        token: str | None = None,
        interval_s: float | None = None,
        gpu_sku: str | None = None,
        gpu_count: int | None = None,
        vcpus: int | None = None,
        memory_gb: float | None = None,
        resource_id: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        device: str | None = None,
        cpu_tdp_w: float = 65.0,
        buffer_size: int = 1000,
        send_every_s: float | None = None,
        flush_timeout_s: float = 30.0,
        barrier: Any = None,
        git_sha: str | None = None,
        tags: list[str] | None = None,
        mode: str | None = None,
    ):
        if assign and arm is not None:
            raise ValueError("arm: pass an arm, or assign=True to let the server assign one")
        self.mode = resolve_mode(mode)
        if assign and self.mode == OFFLINE:
            raise ValueError(
                "assign: assign=True asks the server for the arm before training, and "
                "COSTLAB_MODE=offline never contacts it: pass arm= instead"
            )
        if (interval_s is not None and interval_s <= 0) or buffer_size < 1:
            raise ValueError("interval_s must be > 0 and buffer_size >= 1")
        self.experiment, self._arm_given, self.assign = int(experiment), arm, assign
        self.world = World.from_env(rank=rank, local_rank=local_rank, size=world_size)
        self.rank, self.world_size = self.world.rank, self.world.size
        self.run_key = run_key_for(self.world, run_key)
        self._url, self._token = url, token
        self.interval_s, self.device = interval_s, device
        self.resources = {
            k: v
            for k, v in (
                ("gpu_sku", gpu_sku),
                ("gpu_count", gpu_count),
                ("vcpus", vcpus),
                ("memory_gb", memory_gb),
                ("resource_id", resource_id or os.environ.get("COSTLAB_RESOURCE_ID") or None),
            )
            if v is not None
        }
        self.git_sha = git_sha if git_sha is not None else os.environ.get("GITHUB_SHA", "")
        self.tags = list(tags or [])
        self.cpu_tdp_w, self.buffer_size = cpu_tdp_w, buffer_size
        if send_every_s is not None and send_every_s <= 0:
            raise ValueError("send_every_s must be > 0")
        # The caller's, else the server's once the run is created (see _create), else 2 s.
        self._send_every_given = send_every_s
        self.send_every_s = SEND_EVERY_S if send_every_s is None else send_every_s
        self.flush_timeout_s, self.barrier = flush_timeout_s, barrier
        self._spool_dir = spool_dir
        # Filled as the run starts and ends.
        self.run_id: int | None = None
        self.arm: str | None = None
        self.arm_id: int | None = None
        self.is_control: bool | None = None
        self.strategy: dict | None = None  # assigned: the arm's strategy, defaults filled in
        self.declared: dict | None = None  # assigned: only the keys the arm's YAML sets
        self.strategy_yaml: str | None = None
        self.sticky: bool | None = None
        self.status: str | None = None
        self.cost_usd: str | None = None
        self.spool_path: Path | None = None
        self.samples_left = 0
        self.samples_dropped = 0  # not delivered, and the run had already ended: nobody takes them
        self.error = ""
        self._tried = threading.Event()  # the sender's first try to create the run is over
        self._refusal: Refused | None = None  # a refusal of the run's creation
        self._progress = Progress(0, 0, None, 0.0, 0, None, time.perf_counter())
        # Queued by log_eval, log_metrics and log_params, sent by the sampler.
        self._evaluations: deque[Evaluation] = deque()
        if self.mode == DISABLED:  # nothing drains it: keep nothing
            self._evaluations = deque(maxlen=0)
        self._metrics_said: set[str] = set()  # metric names whose leaving out was said
        self._queue_full_said = False
        self._client: Client | None = None
        self._sampler: Sampler | None = None
        self._sender: Sender | None = None
        self._outbox: Outbox | None = None
        self._started_wall = 0.0
        self._started = self._closed = False
        self._create_lock = threading.Lock()
        self.stream = uuid.uuid4().hex  # this sampler's id: the server refuses a second one

    # -- the training side: O(1), no lock, no I/O -------------------------------------------

    def log(
        self,
        step: int | None = None,
        tokens: Any = None,
        loss: Any = None,
        step_time_s: float | None = None,
        tokens_seen: Any = None,
    ) -> None:
        """One optimizer step done. step: the steps done so far (default: one more than the last
        log). tokens: this rank's tokens in this step (a number or a 0-d tensor: read on the
        sampler thread, so a device tensor costs no sync here). loss: a number or a 0-d tensor.
        step_time_s: default the time since the previous log() (or the start). tokens_seen: the
        world's cumulative tokens where the framework counts them; otherwise the world's are this
        rank's times the world size."""
        now = time.perf_counter()
        p = self._progress
        self._progress = Progress(
            p.step + 1 if step is None else step,
            p.tokens_own if tokens is None else p.tokens_own + tokens,
            p.tokens_seen if tokens_seen is None else tokens_seen,
            p.step_time_total + (now - p.at if step_time_s is None else step_time_s),
            p.steps_timed + 1,
            p.loss if loss is None else loss,
            now,
        )

    def update(self, *, loss: Any = None, tokens_seen: Any = None) -> None:
        """Newer numbers between steps (a framework's logged loss); counts no step."""
        p = self._progress
        self._progress = p._replace(
            loss=p.loss if loss is None else loss,
            tokens_seen=p.tokens_seen if tokens_seen is None else tokens_seen,
        )

    def log_eval(
        self,
        eval_loss: Any = None,
        *,
        metric: str | None = None,
        value: Any = None,
        direction: str | None = None,
        eval_s: float | None = None,
    ) -> None:
        """A held-out evaluation at this point of training (the step and tokens of the last
        log()): `eval_loss` (finite, >= 0; lower is better), and/or a named `metric` with its
        `value` and `direction` ('lower' or 'higher' is better; no default); `eval_s`: the
        seconds it took. Numbers or 0-d tensors (read now). Raises ValueError naming the argument,
        queuing nothing. Sent once, as a sample of its own, through any outage; rank 0's is the
        run's (on other ranks it is checked, then dropped)."""
        fields = evaluation_fields(
            eval_loss, metric=metric, value=value, direction=direction, eval_s=eval_s
        )
        if self._closed:
            raise RuntimeError("log_eval: the run has ended; report evaluations before it ends")
        if self.rank != 0:
            return
        self._evaluations.append(Evaluation(self._progress, fields))
        if self._sampler is not None:
            self._sampler.wake()

    def log_metrics(self, metrics: Mapping[str, Any], *, step: int | None = None) -> None:
        """Training metrics at a step (default: the last log()'s), e.g. {"loss": 2.1,
        "grad_norm": 0.8, "learning_rate": 3e-4}; an evaluation's other figures by their eval_
        names. Values: numbers or 0-d tensors, read now (call it where the trainer logs, not every
        micro-step). Names: 1-64 letters, digits, '_', '.', '/' or '-'; at most 64 a call.
        A value that is not a finite number within +-1e30, a bad name, a 65th metric: left out
        with one line on stderr (once per name), never raised into the training; ValueError only
        for `metrics` not a mapping or `step` not an integer >= 0. Sent once, as a sample of its
        own at the next reading, through any outage; rank 0's are the run's (on other ranks they
        are checked, then dropped). Shown on the run's page and API; never billed."""
        at = self._progress.step if step is None else step_checked(step)
        values, skipped = metrics_checked(metrics, said=self._metrics_said)
        if skipped:
            say(f"run {self.run_id}: metrics left out: {', '.join(skipped)}")
        if not values or not self._event_room("log_metrics"):
            return
        fields: dict[str, Any] = {"metrics": values}
        try:
            fields["metrics_step"] = step_checked(at)
        except ValueError:  # a log() step that is no integer: the sample's own step stands
            pass
        self._evaluations.append(Evaluation(self._progress, fields))

    def log_params(self, params: Mapping[str, Any], *, kind: str = "hyperparameters") -> None:
        """The run's parameters of one `kind` ('hyperparameters': the trainer's arguments;
        'model': its config; a name of 1-64 letters, digits, '_', '.' or '-'): a nested mapping,
        or an object with to_dict() (TrainingArguments, a PretrainedConfig). Made JSON: a value
        JSON has no form for (a dtype, a path, NaN) becomes its str(); past 64 KiB serialized, the
        largest values are replaced with a note of their size, said on stderr. Calling it again
        replaces the keys it names and keeps the others. ValueError naming the argument for a kind
        or params of the wrong kind. Sent as a sample of its own; rank 0's are the run's."""
        values, cut = params_checked(params, kind)
        if cut:
            say(
                f"run {self.run_id}: params of kind '{kind}' pass {MAX_PARAMS_BYTES // 1024} KiB "
                f"serialized; left out: {', '.join(cut[:20])}"
                + (f" and {len(cut) - 20} more" if len(cut) > 20 else "")
            )
        if not values or not self._event_room("log_params"):
            return
        self._evaluations.append(Evaluation(self._progress, {"params": {kind: values}}))

    def _event_room(self, what: str) -> bool:
        """Whether an event of rank 0 may be queued now (said where not, never raised)."""
        if self._closed:
            say(f"run {self.run_id}: {what} after the run ended is not sent")
            return False
        if self.rank != 0:
            return False
        if len(self._evaluations) >= MAX_QUEUED:
            if not self._queue_full_said:
                self._queue_full_said = True
                say(
                    f"run {self.run_id}: {MAX_QUEUED} reports wait to be sampled; later ones are "
                    "dropped (is the run started?)"
                )
            return False
        return True

    # -- start -------------------------------------------------------------------------------

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(*outcome_of(exc))
        return False

    def start(self) -> Run:
        """Start sampling and delivery, and create or join the run: on the sender thread, so the
        training never waits on the site. The start waits up to START_WAIT_S (1 s) for that first
        answer and raises one that will not change (an unknown experiment or arm, a frozen arm, a
        bad token, a finished run's key); with no answer by then, training goes on. assign=True
        waits for the arm first (up to ASSIGN_WAIT_S, then raises). Offline: no server, every
        sample to the spool. Disabled: returns at once, having done nothing."""
        if self._started:
            return self
        refuse_a_second_sampler(self)
        self._started = True
        if self.mode == DISABLED:
            return self
        self._started_wall = time.time()
        safe_key = re.sub(r"[^A-Za-z0-9_.-]", "_", self.run_key)[:80]
        root = default_spool_root() if self._spool_dir is None else Path(self._spool_dir)
        spool = Spool(root / f"{safe_key}-rank{self.rank}")
        if self.mode == OFFLINE:  # every sample straight to disk: a crash loses none of them
            self._outbox = Outbox(capacity=0, spool=spool)
        else:
            self._client = Client(self._url, self._token)
            if self.assign:
                try:
                    self._assign(retry_for_s=ASSIGN_WAIT_S)
                except BaseException:
                    self._client.close()
                    raise
            self._outbox = Outbox(capacity=self.buffer_size, spool=spool)
            self._sender = Sender(
                outbox=self._outbox,
                post=lambda samples, timeout_s: self._client.post_samples(
                    self.run_id, samples, timeout_s
                ),
                ready=self._ready,
                every_s=self.send_every_s,
            )
            self._sender.say_refusal = False  # a refusal of the creation is raised below
            self._sender.start()  # its first try creates the run
        probe = open_probe(self.device, local_rank=self.world.local_rank, cpu_tdp_w=self.cpu_tdp_w)
        self._progress = self._progress._replace(at=time.perf_counter())
        self._sampler = Sampler(
            probe=probe,
            progress=lambda: self._progress,
            interval_s=self.interval_s or 1.0,
            emit=self._outbox.put,
            rank=self.rank,
            world_size=self.world_size,
            evaluations=self._evaluations,
            stream=self.stream,
        ).start()
        if self._sender is not None:
            answered = self._tried.wait(START_WAIT_S)
            self._sender.say_refusal = True
            if self._refusal is not None:
                self._closed = True
                self._sampler.stop()
                self._sender.stop(join_s=0.2)
                self._outbox.discard()
                self._remove_spool()
                self._client.close()
                raise self._refusal
            if not answered:
                say(
                    f"the site has not answered within {START_WAIT_S:g} s: training goes on, and "
                    "the run is created when it answers"
                )
        watch(self)
        return self

    def _assign(self, *, retry_for_s: float) -> None:
        answer = self._client.call(
            "POST",
            f"experiments/{self.experiment}/assign/",
            {"run_key": self.run_key},
            retry_for_s=retry_for_s,
        )
        arm = answer["arm"]
        self.arm, self.arm_id, self.is_control = arm["name"], arm["id"], arm.get("is_control")
        self.strategy, self.strategy_yaml = answer.get("strategy"), answer.get("strategy_yaml")
        self.declared = answer.get("declared")  # the keys the arm's YAML sets (to_trainer_args)
        self.sticky = answer.get("sticky")
        telemetry = (self.strategy or {}).get("telemetry") or {}
        if self.interval_s is None and telemetry.get("interval_s"):
            self.interval_s = float(telemetry["interval_s"])
        shape = (self.strategy or {}).get("distributed") or {}
        declared = int(shape.get("nproc_per_node", 1)) * int(shape.get("nnodes", 1))
        if self.strategy is not None and declared != self.world_size:
            say(
                f"arm '{self.arm}' declares {declared} process(es) (distributed.nproc_per_node x "
                f"nnodes) but this job runs {self.world_size}: the server splits the run's "
                f"resources over {declared} stream(s); declare the job's shape in the arm"
            )

    def _create_body(self, *, deferred: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "experiment": self.experiment,
            "run_key": self.run_key,
            "kind": "external",
            **self.resources,
        }
        arm = self._arm_given
        if self.arm_id is not None:
            body["arm"] = self.arm_id
        elif isinstance(arm, int) or (isinstance(arm, str) and arm.isdigit()):
            body["arm"] = int(arm)
        if self.git_sha:
            body["git_sha"] = self.git_sha
        if self.tags:
            body["tags"] = self.tags
        if deferred:  # its samples since the start fall inside the run's time window
            body["started_at"] = datetime.fromtimestamp(self._started_wall, UTC).isoformat()
        return body

    def _arm_name(self) -> str | None:
        arm = self._arm_given
        if self.arm_id is None and isinstance(arm, str) and not arm.isdigit():
            return arm
        return None

    def _create(self, *, retry_for_s: float, deferred: bool, timeout_s: float = 10.0) -> None:
        with self._create_lock:
            if self.run_id is not None:
                return
            run = self._client.create_run(
                self._create_body(deferred=deferred),
                arm_name=self._arm_name(),
                retry_for_s=retry_for_s,
                timeout_s=timeout_s,
            )
            self.arm, self.arm_id = run["arm"]["name"], run["arm"]["id"]
            self.is_control = run["arm"].get("is_control")
            self.status = run["status"]
            self.run_id = run["id"]
            advised = run.get("telemetry_send_every_s")
            if self._send_every_given is None and advised:  # the server's cadence for its fleet
                self.send_every_s = float(advised)
                if self._sender is not None:  # created late, after an outage at start
                    self._sender.every_s = self.send_every_s

    def _ready(self, timeout_s: float) -> bool:
        """The sender's gate: the run exists (created here, on the sender thread, from the start
        time; its first try is what the start waits for)."""
        if self.run_id is None:
            try:
                self._create(retry_for_s=0.0, deferred=True, timeout_s=timeout_s)
            except Refused as exc:
                self._refusal = exc
                raise
            finally:
                self._tried.set()
        return self.run_id is not None

    # -- end ---------------------------------------------------------------------------------

    def close(self, status: str = "succeeded", error: str = "") -> None:
        """Take the last sample, deliver what is left, then end the run: `succeeded` (rank 0 only:
        the ranks share one run), `failed` or `cancelled` (any rank). Delivery gets up to
        flush_timeout_s while the site answers; a site already failing gets one more try (up to
        1 s), one that stops answering meanwhile OUTAGE_PATIENCE_S, and what is left goes to the
        spool with how the run ended, for `python -m costlab resend DIR`. Offline: all of it goes
        there. Never raises: what went wrong is said on stderr, in one true line."""
        if self._closed or not self._started:
            return
        self._closed = True
        if self.mode == DISABLED:
            return
        open_runs.discard(self)
        try:
            self._close(status, error)
        except Exception as exc:  # the training's own outcome must not be masked by ours
            say(f"run {self.run_id}: closing failed: {type(exc).__name__}: {exc}")
        finally:
            if self._client is not None:
                self._client.close()

    def _close(self, status: str, error: str) -> None:
        self.error = error
        self._sampler.stop()
        sender, delivered = self._sender, False
        if sender is not None:
            delivered = sender.flush(self.flush_timeout_s, patience_s=OUTAGE_PATIENCE_S)
            sender.stop(join_s=2.0 if delivered else 0.2)  # a try under way ends on its own
            # A try under way as the flush gave up may have landed since: a sample leaves the
            # outbox only once the server stored it, so an empty outbox is everything delivered.
            delivered = delivered or not len(self._outbox)
        if status == "succeeded" and self.world_size > 1 and self.barrier is not None:
            self.barrier()  # every rank delivered (or spooled) before rank 0 ends the run
        if sender is not None and sender.run_ended is not None:
            self._drop_spool(sender.run_ended)
            return
        self.samples_left = len(self._outbox)
        ends = status != "succeeded" or self.rank == 0
        if self.samples_left or not delivered:
            self._leave_spool(status if ends else None, error)
            return
        self._outbox.spool.close()
        self._remove_spool()
        if ends and self.run_id is not None:
            self._end(status, error)

    def _end(self, status: str, error: str) -> None:
        try:
            answer = self._client.end_run(self.run_id, status, error, retry_for_s=FINISH_WAIT_S)
        except Unreachable as exc:
            self._leave_spool(status, error, why=f"not ended: {exc}")
            return
        self.status, self.cost_usd = answer["status"], answer.get("cost_usd")
        if answer.get("already_ended"):  # another rank, the dashboard, an earlier lost answer
            say(f"run {self.run_id} had already ended ({self.status}); this end ({status}) is moot")

    def _leave_spool(self, status: str | None, error: str, why: str | None = None) -> None:
        """Spill what was not delivered to the spool, with the pending file `costlab resend`
        reads (how to create the run where it never was, how it ended), and say so."""
        self._outbox.spill()
        path = self.spool_path = self._outbox.spool.directory()
        (path / PENDING).write_text(
            json.dumps(
                {
                    "experiment": self.experiment,
                    "run_key": self.run_key,
                    "run_id": self.run_id,
                    "rank": self.rank,
                    "create": self._create_body(deferred=True),
                    "arm_name": self._arm_name(),
                    "finish": None if status is None else {"status": status, "error": error},
                }
            )
        )
        resend = f"`python -m costlab resend {path}`"
        ending = f" and ends it ({status})" if status is not None else " (rank 0 ends the run)"
        kept = f"{self.samples_left} samples kept in {path}"
        if self.mode == OFFLINE:
            say(
                f"offline (COSTLAB_MODE=offline), run key {self.run_key!r} rank {self.rank}: "
                f"{kept}; {resend} creates the run, sends them{ending}"
            )
            return
        sender = self._sender
        if why is None:
            why = sender.stopped_why or (
                f"the site is failing: {sender.problem or 'no answer'}"
                if sender.failing
                else f"not delivered within {self.flush_timeout_s:g} s"
            )
        if self.run_id is None:
            say(
                f"run key {self.run_key!r} rank {self.rank}: the run is not created ({why}); "
                f"{kept}; {resend} creates it, sends them{ending}"
            )
        else:
            say(
                f"run {self.run_id} rank {self.rank}: {why}; {kept}; the run stays running until "
                f"{resend} sends them{ending}"
            )

    def _drop_spool(self, ended: str) -> None:
        """The run had already ended (someone else finished it): the server takes none of what is
        left, now or later, so nothing is kept for a resend that could not deliver it."""
        self.samples_dropped = self._outbox.discard()
        self.samples_left = 0
        path = self._outbox.spool.path
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        self.status = ended
        which = f"run {self.run_id}"
        if self.run_id is None:
            which = f"the run of key {self.run_key!r}"
        say(
            f"{which} had already ended ({ended}) on the server, which takes no more of its "
            f"samples: the {self.samples_dropped} not delivered are dropped, nothing is left to "
            "resend"
        )

    def _remove_spool(self) -> None:
        path = self._outbox.spool.path
        if path is not None and path.is_dir() and not any(path.glob("segment-*.jsonl")):
            shutil.rmtree(path, ignore_errors=True)

    # -- what the callbacks and tests read ---------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def delivered(self) -> int:
        return 0 if self._sender is None else self._sender.sent

    @property
    def spooled(self) -> int:
        """Samples that went to disk at some point (the buffer was full)."""
        return 0 if self._outbox is None else self._outbox.spooled_total

    @property
    def samples(self) -> int:
        return 0 if self._sampler is None else self._sampler.count
