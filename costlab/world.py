"""Where this process sits in its job: rank, local rank and world size, from the launcher's
environment (torchrun, Lightning, accelerate and Slurm's srun all set RANK / LOCAL_RANK /
WORLD_SIZE), and the run key every rank of one job shares."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @classmethod
    def from_env(
        cls, *, rank: int | None = None, local_rank: int | None = None, size: int | None = None
    ) -> World:
        """Arguments first, then RANK / LOCAL_RANK / WORLD_SIZE; a single process without them."""
        rank = _int_env("RANK", 0) if rank is None else rank
        local_rank = _int_env("LOCAL_RANK", rank) if local_rank is None else local_rank
        size = _int_env("WORLD_SIZE", 1) if size is None else size
        if rank < 0 or local_rank < 0 or size < 1 or rank >= size:
            raise ValueError(
                f"rank {rank} of world size {size} (local rank {local_rank}): "
                "a rank is 0 <= rank < WORLD_SIZE"
            )
        return cls(rank=rank, local_rank=local_rank, size=size)


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def run_key_for(world: World, run_key: str | None) -> str:
    """The run key: the one given, COSTLAB_RUN_KEY, torchrun's job id for a multi-rank job, or a
    random one for a single process. Ranks of one job must agree on it: that is how they share one
    run (the server answers every submission of a key with the same run)."""
    key = run_key or os.environ.get("COSTLAB_RUN_KEY", "").strip()
    if key:
        return key
    if world.size == 1:
        return f"sdk-{uuid.uuid4().hex}"
    job = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if job and job != "none":
        # A restarted world (torchrun --max-restarts) is a new attempt at the job: a run of its own.
        return f"torchrun-{job}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    raise ValueError(
        f"run_key: rank {world.rank} of {world.size} needs the run key its job's ranks share "
        "(pass run_key=, or set COSTLAB_RUN_KEY for every rank)"
    )
