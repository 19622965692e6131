"""An arm's strategy text: validate (gpu_runtime's schema), normalise, hash.

A leaf module: it imports no model and no service, so models, services, the API and the admin
all use it without an import cycle.
"""

from __future__ import annotations

import hashlib

from apps.core.exceptions import ApplicationError


def strategy_sha256(strategy_yaml: str) -> str:
    """Hash of the strategy text as stored (what the run snapshots, and what the CLI hashes)."""
    return hashlib.sha256(strategy_yaml.encode("utf-8")).hexdigest()


def strategy_normalise(strategy_yaml: str) -> str:
    """Text typed into a browser form: LF line endings and one final newline, as a YAML file has."""
    text = strategy_yaml.replace("\r\n", "\n").replace("\r", "\n")
    return text if not text or text.endswith("\n") else text + "\n"


def _refused(field: str, exc) -> ApplicationError:
    return ApplicationError(
        f"{field}: {exc}", {"fields": {field: [f"{e['key']}: {e['message']}" for e in exc.errors]}},
        code="invalid_strategy",
    )


def strategy_validate(strategy_yaml: str, *, field: str = "strategy_yaml") -> None:
    """Refuse a strategy gpu_runtime would refuse, naming the key, before anything is queued."""
    from gpu_runtime import StrategyError, load_strategy

    try:
        load_strategy(strategy_yaml)
    except StrategyError as exc:
        raise _refused(field, exc) from None


def strategy_world_size(strategy_yaml: str, *, gpu: bool, gpu_count: int | None,
                        field: str = "strategy_yaml") -> int:
    """The run's world size (DDP processes, one device each), after refusing what its queue cannot give:
    nccl on the CPU queue, more processes per node than a node's GPUs (the run's declared gpu_count
    over its nodes, else COSTLAB_GPUS_PER_NODE). The strategy is already valid (strategy_validate)."""
    from django.conf import settings

    from gpu_runtime import StrategyError, load_strategy
    from gpu_runtime.schema import distributed_problems

    config = load_strategy(strategy_yaml)
    nodes = config.distributed.nnodes
    if not gpu:
        devices, where = 0, "the cpu queue (no gpu_sku)"
    elif gpu_count is not None:
        devices, where = gpu_count // nodes, f"a node of this run (gpu_count {gpu_count} over {nodes} node(s))"
    else:
        devices, where = settings.COSTLAB_GPUS_PER_NODE, "a GPU worker (COSTLAB_GPUS_PER_NODE)"
    problems = distributed_problems(config, cuda=gpu, devices=devices, where=where)
    if nodes > 1:
        problems.append({"key": "distributed.nnodes", "message": (
            f"{nodes} nodes asked for; workers do not gang-schedule a run across nodes yet: "
            "use nnodes: 1 (nproc_per_node processes on one worker)")})
    if problems:
        raise _refused(field, StrategyError(problems))
    return config.distributed.world_size
