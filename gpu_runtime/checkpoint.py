"""Checkpoints: model, optimizer, scaler and master weights, with the config that produced them.

Saved atomically (write then rename) so a run killed mid-save leaves the previous
checkpoint intact. Loaded with ``weights_only=True``: a checkpoint is data, never code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import StrategyConfig, config_sha256

FORMAT = 1
FILENAME = "checkpoint.pt"


@dataclass
class TrainState:
    """Everything a resumed run needs besides the config and the data
    (which are pure functions of it)."""

    step: int  # steps completed
    tokens: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scaler: dict[str, Any]
    masters: list[torch.Tensor] | None
    dataset_sha256: str


def checkpoint_path(location: str | os.PathLike[str]) -> Path:
    path = Path(location)
    return path / FILENAME if path.is_dir() or not path.suffix else path


def save_checkpoint(
    directory: str | os.PathLike[str], config: StrategyConfig, state: TrainState
) -> Path:
    path = checkpoint_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "config": config.model_dump(mode="json"),
        "config_sha256": config_sha256(config),
        "dataset_sha256": state.dataset_sha256,
        "step": state.step,
        "tokens": state.tokens,
        "model": state.model,
        "optimizer": state.optimizer,
        "scaler": state.scaler,
        "masters": state.masters,
        "rng_cpu": torch.get_rng_state(),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(
    location: str | os.PathLike[str], config: StrategyConfig, *, mmap: bool = False
) -> TrainState:
    """Read a checkpoint and refuse it if it was made for a different model."""
    path = checkpoint_path(location)
    if not path.is_file():
        raise StrategyError.single("resume_from", f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, OSError, EOFError) as exc:
        raise StrategyError.single(
            "resume_from", f"{path} is not a readable checkpoint: {exc}"
        ) from None
    if payload.get("format") != FORMAT:
        raise StrategyError.single(
            "resume_from", f"{path} has format {payload.get('format')!r}, expected {FORMAT}"
        )
    saved_model = payload["config"]["model"]
    if saved_model != config.model.model_dump(mode="json"):
        raise StrategyError.single(
            "model",
            f"the checkpoint was trained with model {saved_model}, not "
            f"{config.model.model_dump(mode='json')}",
        )
    torch.set_rng_state(payload["rng_cpu"])
    return TrainState(
        step=payload["step"],
        tokens=payload["tokens"],
        model=payload["model"],
        optimizer=payload["optimizer"],
        scaler=payload["scaler"],
        masters=payload["masters"],
        dataset_sha256=payload["dataset_sha256"],
    )


def read_checkpoint_config(location: str | os.PathLike[str]) -> dict[str, Any]:
    """The config stored inside a checkpoint, as plain data."""
    payload = torch.load(
        checkpoint_path(location), map_location="cpu", weights_only=True, mmap=True
    )
    return payload["config"]
