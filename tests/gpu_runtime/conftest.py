"""Fixtures for the runtime's tests: small strategies that train in a fraction of a second."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gpu_runtime import StrategyConfig, strategy_from_dict


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tests, restored afterwards.

    The CI box has 2 shared cores: OpenMP threads spinning against other processes
    make step times swing tenfold; one thread keeps training tests quick and steady.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip where torch sees no CUDA device. Here, not in the suite's root
    conftest: bench/gpu_check.sh runs this folder with this conftest alone (no Django there)."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if marked and not torch.cuda.is_available():
        for item in marked:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device; none here"))


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


TINY = {
    "model": {"preset": "tiny", "seq_len": 32},
    "data": {"source": "synthetic", "prefetch": 2},
    "train": {"steps": 5, "global_batch": 4, "lr": 3.0e-3, "warmup_steps": 2, "seed": 0},
    "telemetry": {"interval_s": 0.05},
}


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., StrategyConfig]:
    """``tiny_config(train={"steps": 3})``: the tiny preset on synthetic data, with overrides."""

    def make(**sections: dict[str, Any]) -> StrategyConfig:
        return strategy_from_dict(_merge(TINY, sections))

    return make
