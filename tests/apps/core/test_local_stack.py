"""make run's supervisor with real processes: a dead one is restarted with backoff, the others keep
running, and stopping ends every process (the broker last)."""

import logging
import os
import sys
import time

import pytest

from apps.core.local_stack import LocalStack, ProcessSpec
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # real processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
CRASHER = [sys.executable, "-c", "import sys; sys.exit(3)"]


def supervise_for(stack: LocalStack, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stack.supervise_once()
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_process_is_restarted_and_the_others_keep_running(caplog):
    stack = LocalStack(
        [ProcessSpec("web", SLEEPER), ProcessSpec("worker", SLEEPER)],
        cwd=ROOT,
        backoff_base_s=0.2,
        stop_timeout_s=5,
    )
    stack.start_all()
    try:
        web, worker = stack.children["web"].proc, stack.children["worker"].proc
        web.kill()
        with caplog.at_level(logging.WARNING, logger="costlab.local_stack"):
            supervise_for(stack, 1.0)
        assert (
            stack.children["web"].proc.pid != web.pid and stack.children["web"].proc.poll() is None
        )
        assert stack.children["worker"].proc is worker and worker.poll() is None
        assert stack.restarts() == {"web": 1, "worker": 0}
        assert "web: exited with status -9" in caplog.text and "restarting in 0.2 s" in caplog.text
    finally:
        stack.stop_all()


def test_backoff_doubles_while_a_process_keeps_failing_fast():
    stack = LocalStack(
        [ProcessSpec("crasher", CRASHER)], cwd=ROOT, backoff_base_s=0.1, backoff_max_s=0.4
    )
    stack.start_all()
    try:
        supervise_for(stack, 2.0)
    finally:
        stack.stop_all()
    child = stack.children["crasher"]
    assert child.exits and set(child.exits) == {3}
    assert 3 <= child.restarts <= 8, (
        child.restarts
    )  # 0.1 + 0.2 + 0.4 + 0.4 ... not a restart every poll
    assert [stack.backoff_s(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.4]


def test_stop_all_ends_every_process_and_stops_the_broker_last(tmp_path):
    marker = tmp_path / "order"

    # Each writes its name when SIGTERM arrives, then exits.
    def writer(name: str) -> list[str]:
        return [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            f"def bye(*a): open({str(marker)!r}, 'a').write({name!r} + '\\n'); "
            "time.sleep(0.2); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(600)",
        ]

    stack = LocalStack(
        [
            ProcessSpec("broker", writer("broker"), stop_last=True),
            ProcessSpec("web", writer("web")),
            ProcessSpec("worker", writer("worker")),
        ],
        cwd=ROOT,
        stop_timeout_s=5,
    )
    stack.start_all()
    time.sleep(1.0)  # let them install their handlers
    pids = [c.proc.pid for c in stack.children.values()]
    stack.stop_all()
    assert not any(alive(pid) for pid in pids)
    order = marker.read_text().split()
    assert sorted(order[:2]) == ["web", "worker"] and order[2] == "broker"


def test_training_gets_cores_of_its_own_and_a_thread_per_core(tmp_path):
    from apps.core.local_stack import core_sets, local_stack_specs

    assert core_sets({0}) == (None, None)
    assert core_sets({0, 1}) == ({1}, {0})
    assert core_sets({0, 1, 2, 3, 5}) == ({2, 3, 5}, {0, 1})
    specs = {
        s.name: s
        for s in local_stack_specs(host="127.0.0.1", port=1, var_dir=tmp_path, redis_argv=None)
    }
    train, others = core_sets()
    workers = [s for n, s in specs.items() if n.startswith("train-worker")]
    assert all(specs[n].cpus == others for n in ("web", "platform-worker", "alerts-worker", "beat"))
    if train is None:
        assert [w.cpus for w in workers] == [None]
    else:
        assert set().union(*(w.cpus for w in workers)) == train  # training's cores, split
        assert all(w.env["OMP_NUM_THREADS"] == str(len(w.cpus)) for w in workers)
        assert not train & others


def test_training_has_as_many_slots_as_its_cores_allow(tmp_path, settings):
    """Issue 25: `make run` had one training slot whatever the host; training's cores are now
    split into workers of COSTLAB_TRAIN_CORES_PER_SLOT cores, each its own CPU set and threads."""
    from apps.core import local_stack
    from apps.core.local_stack import train_slots

    assert train_slots(None, cores_per_slot=4) == [None]
    assert train_slots(frozenset({1}), cores_per_slot=4) == [{1}]
    assert train_slots(frozenset(range(8, 16)), cores_per_slot=4) == [
        set(range(8, 12)),
        set(range(12, 16)),
    ]
    assert train_slots(frozenset(range(8, 18)), cores_per_slot=4) == [
        set(range(8, 12)),
        set(range(12, 18)),  # the remainder joins the last slot
    ]
    settings.COSTLAB_TRAIN_CORES_PER_SLOT = 4
    original = local_stack.core_sets
    local_stack.core_sets = lambda: (frozenset(range(8, 16)), frozenset(range(8)))
    try:
        specs = local_stack.local_stack_specs(
            host="127.0.0.1", port=1, var_dir=tmp_path, redis_argv=None
        )
    finally:
        local_stack.core_sets = original
    train = [s for s in specs if s.name.startswith("train-worker")]
    assert [s.name for s in train] == ["train-worker", "train-worker-2"]
    assert [s.cpus for s in train] == [set(range(8, 12)), set(range(12, 16))]
    assert all(s.env["OMP_NUM_THREADS"] == "4" for s in train)
    hostnames = [s.argv[s.argv.index("--hostname") + 1] for s in train]
    assert len(set(hostnames)) == 2


def test_a_process_runs_on_its_cpu_set_with_its_environment(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    out = tmp_path / "seen"
    probe = [
        sys.executable,
        "-c",
        f"import os; open({str(out)!r}, 'w').write("
        "repr((sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'])))",
    ]
    stack = LocalStack(
        [ProcessSpec("probe", probe, cpus=frozenset({cpu}), env={"OMP_NUM_THREADS": "1"})], cwd=ROOT
    )
    stack.start("probe")
    stack.children["probe"].proc.wait(timeout=30)
    assert out.read_text() == repr(([cpu], "1"))
