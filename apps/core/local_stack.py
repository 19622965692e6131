"""`make run`'s local stack: web, workers, beat (and the embedded Redis),
each restarted when it dies.

A process that exits on its own is logged and started again after a backoff that doubles
with each quick failure (1 s, 2 s, 4 s ... capped) and resets once it has stayed up; the
others keep running. Stopping sends SIGTERM to everything but the broker, waits (a worker
hands its training run back to the queue at the next step boundary), then stops the broker.

This is a laptop's supervisor, not a scheduler: in production every role is its own
container, restarted by Compose or Kubernetes (docker-compose.yml).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from apps.core.queues import CeleryQueue

logger = logging.getLogger("costlab.local_stack")


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: list[str]
    # Stopped after every other process (the broker: workers still talk to it while stopping).
    stop_last: bool = False
    # CPUs the process (and its children: Celery's pool) may run on; None: wherever the supervisor
    # may
    cpus: frozenset[int] | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to the supervisor's environment


def core_sets(
    available: set[int] | None = None,
) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(training's CPUs, everything else's): training runs never share a core with each other or
    the platform.

    The training worker runs one run at a time (concurrency 1) on the upper half of the CPUs,
    with as many torch threads as it has cores; web, the other workers and beat get the rest.
    One CPU: no pinning (None, None).
    """
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    half = len(cpus) // 2
    return frozenset(cpus[half:]), frozenset(cpus[:half])


def train_slots(train_cpus: frozenset[int] | None, *, cores_per_slot: int) -> list:
    """Training's CPUs split into slots of `cores_per_slot` cores, one training worker each (one
    run at a time, as many torch threads as its cores): as many runs train at once as the host's
    cores allow without sharing a core. Fewer cores than a slot: one slot of them all; no pinning
    (one CPU): one unpinned slot."""
    if train_cpus is None:
        return [None]
    cpus = sorted(train_cpus)
    per = max(int(cores_per_slot), 1)
    count = max(len(cpus) // per, 1)
    slots = [cpus[i * per : (i + 1) * per] for i in range(count)]
    slots[-1] = cpus[(count - 1) * per :]  # the remainder joins the last slot
    return [frozenset(s) for s in slots]


@dataclass
class Supervised:
    spec: ProcessSpec
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    quick_failures: int = 0
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)


def local_stack_specs(
    *, host: str, port: int, var_dir: Path, redis_argv: list[str] | None
) -> list[ProcessSpec]:
    """The processes of `make run`, in start order. Training never shares a worker with the
    attribution tick, and alert deliveries (slow webhook receivers) have their own. With two or
    more CPUs training has its own cores (`core_sets`), split into as many training workers as
    COSTLAB_TRAIN_CORES_PER_SLOT allows (`train_slots`), each training one run at a time."""
    python = sys.executable
    celery = [
        python,
        "-m",
        "celery",
        "-A",
        "config.celery_app",
        "--quiet",
    ]  # no ASCII banners over the sign-in
    train_cpus, other_cpus = core_sets()
    slots = train_slots(train_cpus, cores_per_slot=settings.COSTLAB_TRAIN_CORES_PER_SLOT)

    def threads_for(cpus: frozenset[int]) -> dict[str, str]:
        return {name: str(len(cpus)) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}

    specs = [ProcessSpec("redis", redis_argv, stop_last=True)] if redis_argv else []
    return specs + [
        ProcessSpec(
            "web",
            [python, "manage.py", "runserver", "--noreload", f"{host}:{port}"],
            cpus=other_cpus,
        ),
        *(
            ProcessSpec(
                "train-worker" if i == 0 else f"train-worker-{i + 1}",
                [
                    *celery,
                    "worker",
                    "-Q",
                    f"{CeleryQueue.CPU},{CeleryQueue.GPU}",
                    "--concurrency",
                    "1",
                    "--hostname",
                    "train@%h" if i == 0 else f"train{i + 1}@%h",
                    "--loglevel",
                    "INFO",
                ],
                cpus=slot,
                env={} if slot is None else threads_for(slot),
            )
            for i, slot in enumerate(slots)
        ),
        ProcessSpec(
            "platform-worker",
            [
                *celery,
                "worker",
                "-Q",
                str(CeleryQueue.DEFAULT),
                "--concurrency",
                "1",
                "--hostname",
                "platform@%h",
                "--loglevel",
                "INFO",
            ],
            cpus=other_cpus,
        ),
        ProcessSpec(
            "alerts-worker",
            [
                *celery,
                "worker",
                "-Q",
                str(CeleryQueue.ALERTS),
                "--pool",
                "threads",
                "--concurrency",
                "4",
                "--hostname",
                "alerts@%h",
                "--loglevel",
                "INFO",
            ],
            cpus=other_cpus,
        ),
        ProcessSpec(
            "beat",
            [*celery, "beat", "--loglevel", "INFO", "--pidfile", str(var_dir / "celerybeat.pid")],
            cpus=other_cpus,
        ),
    ]


class LocalStack:
    """Starts the specs, restarts any that exits with backoff, stops them all in order."""

    def __init__(
        self,
        specs: list[ProcessSpec],
        *,
        cwd: Path,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 30.0,
        healthy_after_s: float = 30.0,
        stop_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.children = {spec.name: Supervised(spec) for spec in specs}
        self.cwd = cwd
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.healthy_after_s = healthy_after_s
        self.stop_timeout_s = stop_timeout_s
        self.clock = clock

    def start(self, name: str) -> None:
        child = self.children[name]
        # Own session: Ctrl-C reaches only the supervisor, which stops children in order,
        # and a child's own children (Celery's pool) are stopped with it.
        cpus, env = child.spec.cpus, child.spec.env
        child.proc = subprocess.Popen(
            child.spec.argv,
            cwd=self.cwd,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
            # in the child before exec: its threads and Celery's forked pool inherit the CPU set
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        child.started_at = self.clock()
        child.restart_at = None
        logger.info("%s: started (pid %d)", name, child.proc.pid)

    def start_all(self, names: list[str] | None = None) -> None:
        for name in names or list(self.children):
            if self.children[name].proc is None:
                self.start(name)

    def backoff_s(self, quick_failures: int) -> float:
        return min(self.backoff_base_s * 2 ** max(quick_failures - 1, 0), self.backoff_max_s)

    def supervise_once(self) -> None:
        """Notice exited processes (log, schedule a restart) and start those whose
        backoff is over."""
        now = self.clock()
        for name, child in self.children.items():
            if child.proc is not None and child.restart_at is None:
                status = child.proc.poll()
                if status is None:
                    continue
                uptime = now - child.started_at
                child.exits.append(status)
                child.quick_failures = (
                    1 if uptime >= self.healthy_after_s else child.quick_failures + 1
                )
                delay = self.backoff_s(child.quick_failures)
                child.restart_at = now + delay
                logger.warning(
                    "%s: exited with status %s after %.1f s; restarting in %.1f s (restart %d)",
                    name,
                    status,
                    uptime,
                    delay,
                    child.restarts + 1,
                )
            if child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self.start(name)

    def run(
        self,
        should_stop: Callable[[], bool],
        interval_s: float = 0.2,
        each: Callable[[], None] | None = None,
    ) -> None:
        while not should_stop():
            self.supervise_once()
            if each is not None:
                each()
            time.sleep(interval_s)

    def stop_all(self) -> None:
        first = [c for c in self.children.values() if not c.spec.stop_last]
        last = [c for c in self.children.values() if c.spec.stop_last]
        for group in (first, last):
            running = [c for c in group if c.proc is not None and c.proc.poll() is None]
            for child in running:
                logger.info("%s: stopping (pid %d)", child.spec.name, child.proc.pid)
                child.proc.send_signal(signal.SIGTERM)
            deadline = self.clock() + self.stop_timeout_s
            for child in running:
                try:
                    child.proc.wait(timeout=max(deadline - self.clock(), 0.1))
                except subprocess.TimeoutExpired:
                    logger.warning(
                        "%s: did not stop within %.0f s; killed",
                        child.spec.name,
                        self.stop_timeout_s,
                    )
            for child in group:
                if child.proc is not None:
                    _kill_session(child.proc)

    def restarts(self) -> dict[str, int]:
        return {name: child.restarts for name, child in self.children.items()}


def _kill_session(proc: subprocess.Popen) -> None:
    """Whatever is left of the child's session (e.g. a pool process) goes too."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
