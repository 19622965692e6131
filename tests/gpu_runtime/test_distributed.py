"""DDP on CPU with gloo, 2 ranks launched by torch's elastic launcher: the same training as one
process, every rank stopping at the same step, and a dying rank failing the run by name."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import torch

from gpu_runtime import StrategyError, train
from gpu_runtime.checkpoint import checkpoint_path
from gpu_runtime.distributed import DistributedError
from gpu_runtime.schema import config_sha256
from tests.helpers import rank_processes

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # ranks are processes

DDP = {"distributed": {"nproc_per_node": 2}}
# Two micro-batches per rank (four in one process): no_sync is on the path, and the world's
# gradient is the single process's.
PARITY = {
    "train": {"global_batch": 8, "micro_batch": 2, "warmup_steps": 2},
    "data": {"prefetch": 0},
    "telemetry": {"enabled": False},
}


def _rank_processes() -> list[psutil.Process]:
    return rank_processes()


def _params(directory) -> dict[str, torch.Tensor]:
    payload = torch.load(checkpoint_path(directory), map_location="cpu", weights_only=True)
    return payload["model"], payload["config"]


def test_two_ranks_train_as_one_process(tiny_config, tmp_path):
    one_step = {**PARITY, "train": {**PARITY["train"], "steps": 1}}
    train(tiny_config(**one_step), checkpoint_dir=str(tmp_path / "single"))
    ddp_result = train(tiny_config(**one_step, **DDP), checkpoint_dir=str(tmp_path / "ddp"))
    single, _ = _params(tmp_path / "single")
    world, saved_config = _params(tmp_path / "ddp")  # rank 0 checkpoints, with its config
    assert saved_config["distributed"]["nproc_per_node"] == 2
    assert set(single) == set(world)
    worst = max((single[k].float() - world[k].float()).abs().max().item() for k in single)
    assert worst <= 1e-5, worst
    assert ddp_result.strategies["distributed"]["world_size"] == 2
    assert ddp_result.strategies["distributed"]["backend"] == "gloo"
    assert ddp_result.strategies["distributed"]["rendezvous"]["backend"] == "c10d"

    twenty = {**PARITY, "train": {**PARITY["train"], "steps": 20}}
    alone = train(tiny_config(**twenty))
    together = train(tiny_config(**twenty, **DDP))
    assert together.steps == alone.steps == 20 and together.tokens == alone.tokens
    assert abs(together.final_loss - alone.final_loss) / alone.final_loss <= 0.01, (
        alone.final_loss,
        together.final_loss,
    )
    assert [r["final_loss"] for r in together.strategies["distributed"]["ranks"]] == [
        together.final_loss
    ] * 2
    assert not _rank_processes()


def test_the_ranks_evaluate_their_shares_and_rank_0_reports_the_worlds_held_out_loss(
    tiny_config,
):
    one_step = {
        **PARITY,
        "train": {**PARITY["train"], "steps": 1},
        "telemetry": {"enabled": True, "interval_s": 60.0},
        "eval": {"holdout": 0.1, "max_tokens": 512},
    }
    alone = train(tiny_config(**one_step))
    samples = []
    together = train(tiny_config(**one_step, **DDP), sink=samples.append)
    # one evaluation sample, rank 0's; every rank holds the world's loss (one all-reduce)
    assert [(s["rank"], s["step"]) for s in samples if "eval_loss" in s] == [(0, 1)]
    assert together.eval_loss == pytest.approx(alone.eval_loss, abs=1e-4)
    ranks = together.strategies["distributed"]["ranks"]
    assert [r["eval_loss"] for r in ranks] == [together.eval_loss] * 2
    assert together.eval_s > 0 and [e["step"] for e in together.evaluations] == [1]
    assert not _rank_processes()


def test_cancel_and_a_live_update_reach_both_ranks_at_the_same_step(tiny_config):
    config = tiny_config(
        train={"steps": 400}, telemetry={"interval_s": 0.05, "peak_flops": 1e11}, **DDP
    )
    seen: list[dict] = []
    pushed: list[int] = []

    def live():
        if not pushed and any(s["step"] >= 2 for s in seen):
            pushed.append(1)
            return {"telemetry": {"interval_s": 0.1}}
        return None

    result = train(
        config, sink=seen.append, live=live, cancel=lambda: any(s["step"] >= 6 for s in seen)
    )
    ranks = result.strategies["distributed"]["ranks"]
    assert result.status == "cancelled" and 6 <= result.steps < 400
    assert [r["status"] for r in ranks] == ["cancelled", "cancelled"]
    assert [r["steps"] for r in ranks] == [result.steps] * 2  # the same step boundary
    assert [r["live_applied"] for r in ranks] == [1, 1]
    wanted = config.model_copy(
        update={"telemetry": config.telemetry.model_copy(update={"interval_s": 0.1})}
    )
    assert [r["live_config_sha256"] for r in ranks] == [config_sha256(wanted)] * 2
    # each rank sampled its own process; one seq space for the run
    assert {s["rank"] for s in seen} == {0, 1}
    assert [s["seq"] for s in seen] == list(range(len(seen))) and result.samples == len(seen)
    assert all(s["mfu"] is not None for s in seen if s["tokens_per_s"])
    assert result.energy_j == pytest.approx(sum(r["energy_j"] for r in ranks))
    assert not _rank_processes()


def test_sigterm_stops_every_rank_at_one_step_boundary(tiny_config):
    config = tiny_config(train={"steps": 400}, **DDP)
    sent: list[int] = []

    def sink(sample):
        if not sent and sample["step"] >= 3:
            sent.append(1)
            os.kill(
                os.getpid(), signal.SIGTERM
            )  # the owner takes it; the ranks follow at one boundary

    result = train(config, sink=sink)
    ranks = result.strategies["distributed"]["ranks"]
    assert result.status == "interrupted" and result.steps < 400
    assert [(r["status"], r["steps"]) for r in ranks] == [("interrupted", result.steps)] * 2


def test_a_killed_rank_fails_the_run_by_name_and_leaves_no_process(tiny_config):
    config = tiny_config(train={"steps": 400}, **DDP)
    pids: list[int] = []

    def sink(sample):
        if not pids and sample["step"] >= 2:
            ranks = _rank_processes()
            pids.extend(p.pid for p in ranks)
            victim = next(p for p in ranks if p.name() == "costlab-rank-1")
            victim.send_signal(signal.SIGKILL)

    with pytest.raises(DistributedError) as info:
        train(config, sink=sink)
    message = str(info.value)
    assert "rank 1" in message and ("SIGKILL" in message or "Signal 9" in message), message
    assert len(pids) == 2
    for pid in pids:  # every rank is gone (reaped), none left behind
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not _rank_processes()


def test_the_killed_rank_is_named_even_when_its_peer_is_recorded_first(tmp_path):
    """A clean-clone CI run named rank 0 (its "Connection closed by peer", stopped by the launcher's
    SIGTERM, recorded before rank 1's death) for a rank 1 killed from outside: the death a
    launcher never causes is the root."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from gpu_runtime.distributed import _failure_message

    peer = ProcessFailure(local_rank=0, pid=10, exitcode=-15, error_file=str(tmp_path / "none"))
    peer.message, peer.timestamp = "RuntimeError: Connection closed by peer [127.0.0.1]:1", 100
    killed = ProcessFailure(local_rank=1, pid=11, exitcode=-9, error_file=str(tmp_path / "none"))
    killed.timestamp = 101
    message = _failure_message(ChildFailedError("rank", {0: peer, 1: killed}))
    assert message.startswith("distributed: rank 1 (pid 11)") and "SIGKILL" in message, message
    assert message.endswith("(then rank 0 stopped)"), message
    # Without such a death, the first failure in time stays the one named.
    crashed = ProcessFailure(local_rank=1, pid=11, exitcode=1, error_file=str(tmp_path / "none"))
    crashed.message, crashed.timestamp = "ValueError: bad batch", 99
    assert _failure_message(ChildFailedError("rank", {0: peer, 1: crashed})).startswith(
        "distributed: rank 1 (pid 11) failed with exit code 1: ValueError: bad batch"
    )


def test_what_a_host_cannot_give_a_distributed_run_is_refused_by_key(tiny_config):
    with pytest.raises(StrategyError) as info:
        train(tiny_config(distributed={"nproc_per_node": 2, "backend": "nccl"}), device="cpu")
    assert [e["key"] for e in info.value.errors] == ["distributed.backend"]
    with pytest.raises(StrategyError) as info:
        tiny_config(placement={"gpus": 2}, distributed={"nproc_per_node": 4})
    assert [e["key"] for e in info.value.errors] == ["placement.gpus"]
    with pytest.raises(StrategyError) as info:
        tiny_config(train={"global_batch": 3}, distributed={"nproc_per_node": 2})
    assert [e["key"] for e in info.value.errors] == ["train.global_batch"]
    with pytest.raises(StrategyError) as info:  # ranks would each pick their own global batch
        tiny_config(
            optimizer={
                "dynamic_batching": {
                    "enabled": True,
                    "min_micro_batch": 1,
                    "max_micro_batch": 2,
                    "adaptive_global_batch": True,
                    "min_global_batch": 2,
                }
            },
            distributed={"nproc_per_node": 2},
        )
    assert [e["key"] for e in info.value.errors] == [
        "optimizer.dynamic_batching.adaptive_global_batch"
    ]


def test_more_processes_than_devices_on_a_gpu_host_is_refused_by_key(tiny_config):
    from gpu_runtime.schema import distributed_problems

    config = tiny_config(distributed={"nproc_per_node": 4})
    problems = distributed_problems(config, cuda=True, devices=2, where="this host")
    assert [p["key"] for p in problems] == ["distributed.nproc_per_node"]
    assert "4 processes" in problems[0]["message"] and "has 2" in problems[0]["message"]
    assert distributed_problems(config, cuda=True, devices=4, where="this host") == []
    assert (
        distributed_problems(config, cuda=False, devices=0, where="this host") == []
    )  # gloo on CPU


def test_rank_0s_batch_scaler_decides_the_micro_batch_of_every_rank(tiny_config):
    config = tiny_config(
        train={"steps": 10, "global_batch": 8},
        telemetry={"interval_s": 0.02},
        optimizer={
            "dynamic_batching": {
                "enabled": True,
                "min_micro_batch": 1,
                "max_micro_batch": 8,
                "stability_window": 2,
            }
        },
        **DDP,
    )
    samples: list[dict] = []
    result = train(config, sink=samples.append)
    ranks = result.strategies["distributed"]["ranks"]
    assert result.micro_batch_events, "the micro-batch never changed"
    assert [r["scaler_events"] for r in ranks] == [
        len(result.micro_batch_events),
        0,
    ]  # rank 1 follows
    by_rank: dict[int, dict[int, int]] = {0: {}, 1: {}}
    for s in samples:
        if s["step"]:
            by_rank[s["rank"]][s["step"]] = s["micro_batch"]
    common = set(by_rank[0]) & set(by_rank[1])
    assert common and all(by_rank[0][step] == by_rank[1][step] for step in common), by_rank
    assert len({*by_rank[0].values(), *by_rank[1].values()}) > 1


def test_two_nodes_meet_at_one_rendezvous_and_train_as_one_process(tiny_config):
    import threading

    from gpu_runtime.distributed import Rendezvous, free_port

    twenty = {**PARITY, "train": {**PARITY["train"], "steps": 20}}
    config = tiny_config(**twenty, distributed={"nproc_per_node": 1, "nnodes": 2})
    endpoint = f"127.0.0.1:{free_port()}"
    results: dict[int, object] = {}

    def node(index: int) -> None:
        try:
            results[index] = train(
                config,
                rendezvous=Rendezvous(
                    endpoint=endpoint,
                    id="test-two-nodes",
                    is_host=index == 0,
                    join_timeout_s=60,
                    local_addr="127.0.0.1",
                ),
            )
        except Exception as exc:  # noqa: BLE001 - asserted below
            results[index] = exc

    threads = [threading.Thread(target=node, args=(i,)) for i in (1, 0)]  # the guest may come first
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    alone = train(tiny_config(**twenty))
    for index in (0, 1):
        result = results[index]
        assert not isinstance(result, Exception), result
        assert result.status == "completed" and result.steps == 20
        assert abs(result.final_loss - alone.final_loss) / alone.final_loss <= 0.01
        assert result.strategies["distributed"]["rendezvous"] == {
            "backend": "c10d",
            "endpoint": endpoint,
            "id": "test-two-nodes",
        }
    assert sorted(
        r["rank"] for i in (0, 1) for r in results[i].strategies["distributed"]["ranks"]
    ) == [0, 1]


def test_a_node_alone_gives_up_at_the_join_timeout(tiny_config):
    from gpu_runtime.distributed import Rendezvous, free_port

    config = tiny_config(distributed={"nproc_per_node": 1, "nnodes": 2})
    with pytest.raises(StrategyError) as refused:
        train(config)  # across nodes, a rendezvous is needed
    assert refused.value.errors[0]["key"] == "distributed.nnodes"
    with pytest.raises(DistributedError) as info:
        train(
            config,
            rendezvous=Rendezvous(
                endpoint=f"127.0.0.1:{free_port()}",
                id="test-alone",
                is_host=True,
                join_timeout_s=3,
                local_addr="127.0.0.1",
            ),
        )
    assert "distributed.rendezvous" in str(info.value) and "not every node joined" in str(
        info.value
    )
    assert not _rank_processes()
