"""An arm's strategy text: validate (gpu_runtime's schema), normalise, hash.

A leaf module: it imports no model and no service, so models, services, the API and the admin
all use it without an import cycle.
"""

from __future__ import annotations

import hashlib

from apps.core.exceptions import ApplicationError


def strategy_sha256(strategy_yaml: str) -> str:
    """Hash of the normalised strategy text: what is stored and what a run snapshots. The same YAML
    hashes the same whether it was typed in a browser (CRLF, no final newline) or read from a file;
    the CLI hashes a file the same way (costlab_cli.submit.strategy_digest)."""
    return hashlib.sha256(strategy_normalise(strategy_yaml).encode("utf-8")).hexdigest()


def strategy_normalise(strategy_yaml: str) -> str:
    """LF line endings and exactly one final newline, as a YAML file has (text typed into a browser
    form comes with CRLF and no final newline). Applied before any strategy text is hashed or
    stored."""
    text = strategy_yaml.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    return text + "\n" if text else ""


def _refused(field: str, exc) -> ApplicationError:
    return ApplicationError(
        f"{field}: {exc}",
        {"fields": {field: [f"{e['key']}: {e['message']}" for e in exc.errors]}},
        code="invalid_strategy",
    )


def strategy_validate(strategy_yaml: str, *, field: str = "strategy_yaml") -> None:
    """Refuse a strategy gpu_runtime would refuse, naming the key, before anything is queued."""
    from gpu_runtime import StrategyError, load_strategy

    try:
        load_strategy(strategy_yaml)
    except StrategyError as exc:
        raise _refused(field, exc) from None


def strategy_filled(strategy_yaml: str) -> dict:
    """The strategy as gpu_runtime reads it, every default filled in, as JSON (what a trainer
    outside costlab applies)."""
    from gpu_runtime import load_strategy

    return load_strategy(strategy_yaml).model_dump(mode="json")


def strategy_declared(strategy_yaml: str) -> dict:
    """The keys the strategy's YAML sets (checked and normalised by gpu_runtime's schema), without
    the defaults: what an arm asks of a trainer outside costlab, told apart from what it leaves
    to the trainer (costlab.strategy.to_trainer_args applies these only)."""
    from gpu_runtime import load_strategy

    return load_strategy(strategy_yaml).model_dump(mode="json", exclude_unset=True)


def strategy_world_size(
    strategy_yaml: str, *, gpu: bool, gpu_count: int | None, field: str = "strategy_yaml"
) -> tuple[int, int]:
    """The run's world size (DDP processes, one device each) and nodes, after refusing what its
    queue cannot give:
    nccl on the CPU queue, more processes per node than a node's GPUs (the run's declared gpu_count
    over its nodes, else COSTLAB_GPUS_PER_NODE). The strategy is already valid
    (strategy_validate)."""
    from django.conf import settings

    from gpu_runtime import StrategyError, load_strategy
    from gpu_runtime.schema import distributed_problems

    config = load_strategy(strategy_yaml)
    nodes = config.distributed.nnodes
    if not gpu:
        devices, where = 0, "the cpu queue (no gpu_sku)"
    elif gpu_count is not None:
        devices, where = (
            gpu_count // nodes,
            f"a node of this run (gpu_count {gpu_count} over {nodes} node(s))",
        )
    else:
        devices, where = settings.COSTLAB_GPUS_PER_NODE, "a GPU worker (COSTLAB_GPUS_PER_NODE)"
    problems = distributed_problems(config, cuda=gpu, devices=devices, where=where)
    if problems:
        raise _refused(field, StrategyError(problems))
    return config.distributed.world_size, nodes


def strategy_device_warnings(
    strategy_yaml: str, *, queue: str | None = None, field: str = "strategy_yaml"
) -> list[dict]:
    """What the devices `queue` has seen (None: every training queue) say of this valid
    strategy: warnings ({queue, key, message, ratio, devices}) for a dtype that is emulated or
    slower than fp32 on all of them. A dtype none of them can run at all is refused, naming the
    key, before anything is stored or queued."""
    from apps.core.queues import CeleryQueue
    from apps.devices.selectors import strategy_device_findings
    from gpu_runtime import StrategyError, load_strategy

    config = load_strategy(strategy_yaml)
    out = []
    for q in [queue] if queue else [CeleryQueue.CPU.value, CeleryQueue.GPU.value]:
        warnings, refusals = strategy_device_findings(config=config, queue=q)
        if refusals and queue:
            raise _refused(field, StrategyError(refusals))
        out += [{"queue": q, **w.as_dict()} for w in warnings]
    return out
