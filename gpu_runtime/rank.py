"""One DDP rank's process: ``python -m gpu_runtime.rank WORKDIR``, started by torch's elastic agent.

``record`` writes an uncaught exception to the agent's error file, so the run's error names
this rank and the exception, not only an exit code.
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


# ------------------------------------------------------------------------------
# A rank's process
# ------------------------------------------------------------------------------
def _exit_with_owner(owner_pid: int) -> None:
    """A rank whose owner died (killed outright, no time to close the launcher) ends too: no
    orphans."""

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != owner_pid:
                os._exit(70)

    threading.Thread(target=watch, name="gpu_runtime-owner-watch", daemon=True).start()


def rank_main(workdir: str) -> None:
    """Entry point of one rank (``python -m gpu_runtime.rank WORKDIR``), started by the elastic
    agent."""
    from gpu_runtime.result import JsonlSink
    from gpu_runtime.runtime import train_local

    root = Path(workdir)
    spec = json.loads((root / SPEC).read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
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
