"""One-line callbacks for the trainers teams already run: ``transformers.Trainer``
(``costlab.integrations.transformers``) and Lightning (``costlab.integrations.lightning``).
Each imports its framework only when imported itself."""

from __future__ import annotations

import os
import uuid
from typing import Any


def tokens_in(batch: Any) -> Any:
    """The tokens a batch trains on, without a host sync: the attention mask's sum (a 0-d tensor,
    read later on the sampler thread) where there is one, else the input ids' count; a tuple or
    list: its first element; a tensor of integer ids: its size. None: nothing to count."""
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        if mask is not None:
            return mask.sum()
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        return None if ids is None else ids.numel()
    if isinstance(batch, list | tuple):
        return tokens_in(batch[0]) if batch else None
    dtype = getattr(batch, "dtype", None)
    if (
        dtype is not None
        and hasattr(batch, "numel")
        and not getattr(dtype, "is_floating_point", True)
    ):
        return batch.numel()
    return None


def shared_run_key(given: str | None, *, world_size: int, rank: int, broadcast) -> str | None:
    """The run key every rank of the job uses: the one given (or COSTLAB_RUN_KEY), else rank 0's
    fresh one, sent to the others by `broadcast(key) -> key` (the framework's collective)."""
    key = given or os.environ.get("COSTLAB_RUN_KEY", "").strip() or None
    if key or world_size == 1:
        return key
    return broadcast(f"sdk-{uuid.uuid4().hex}" if rank == 0 else None)
