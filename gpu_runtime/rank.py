"""One DDP rank's process: ``rank_main(WORKDIR)``, started by torch's elastic agent, forked from
the launch's forkserver or, in a daemonic process, a new interpreter
(gpu_runtime.distributed._rank_entry); the agent's ``record``
writes an uncaught exception to its error file, so the run's error names this rank and the
exception, not only an exit code. ``python -m gpu_runtime.rank WORKDIR`` runs one by hand.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch

from gpu_runtime.schema import config_sha256, strategy_from_dict
from gpu_runtime.world import CONTROL, SPEC, World, process_group, write_json

EXIT_AFTER_RAISE_S = 1.0


# ------------------------------------------------------------------------------
# A rank's process
# ------------------------------------------------------------------------------
def _exit_with_owner(owner_pid: int) -> None:
    """A rank whose owner died (killed outright, no time to close the launcher) ends too: no
    orphans. Its parent is the owner, or the owner's forkserver, which exits with the owner: the
    rank sees its parent change, or the owner gone."""
    parent = os.getppid()

    def owner_alive() -> bool:
        try:
            os.kill(owner_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent or not owner_alive():
                os._exit(70)

    threading.Thread(target=watch, name="gpu_runtime-owner-watch", daemon=True).start()


def _name_process(rank: int) -> None:
    """ps, top and psutil show which rank a process is: Linux's process name (15 bytes), as the
    command line is the forkserver's. Elsewhere nothing changes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, f"costlab-rank-{rank}".encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def rank_main(workdir: str) -> None:
    """Entry point of one rank, started by the elastic agent (gpu_runtime.distributed)."""
    from gpu_runtime.result import JsonlSink
    from gpu_runtime.runtime import train_local

    root = Path(workdir)
    spec = json.loads((root / SPEC).read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    _name_process(rank)
    _exit_with_owner(int(spec["owner_pid"]))
    torch.set_num_threads(int(spec["threads"]))
    if spec["device_type"] == "cuda":
        device = torch.device("cuda", spec["devices"][local_rank])
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    config = strategy_from_dict(spec["config"])
    world = World(
        rank=rank,
        world_size=world_size,
        control=root / CONTROL if local_rank == 0 else None,
        device=device,
    )
    sink = JsonlSink(root / f"samples-{local_rank}.jsonl")
    try:
        with process_group(spec["backend"], device):
            result = train_local(
                config,
                sink=sink,
                device=str(device),
                world=world,
                checkpoint_dir=spec["checkpoint_dir"] if rank == 0 else None,
                artifacts_dir=spec.get("artifacts_dir") if rank == 0 else None,
                resume_from=spec["resume_from"],
            )
    except Exception:
        # The agent names one failed rank: the first dead one it sees (it polls every
        # monitor_interval, 0.1 s). A rank that raises waits before it exits, so that a peer whose
        # death caused the raise (SIGKILL, the OOM killer: "Connection reset by peer" here) is
        # seen dead first, and named; a rank that raised first still exits before its peers.
        time.sleep(EXIT_AFTER_RAISE_S)
        raise
    finally:
        sink.close()
    live_sha = None if world.live_config is None else config_sha256(world.live_config)
    write_json(
        root / f"result-{local_rank}.json",
        {
            **result.to_dict(),
            "rank": rank,
            "live_applied": world.live_version,
            "live_config_sha256": live_sha,
        },
    )


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    record(rank_main)(sys.argv[-1])
