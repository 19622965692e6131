import copy

import pytest
import torch
from torch import nn

from gpu_runtime.strategies.checkpointing import (
    apply_gradient_checkpointing,
    is_checkpointed,
    measure_peak_memory,
    peak_memory_with_and_without,
    remove_gradient_checkpointing,
)


class Block(nn.Module):
    calls = 0

    def __init__(self, dim=64):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x, scale=1.0):
        Block.calls += 1
        return x + scale * self.down(torch.nn.functional.gelu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, n=4, dim=64):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=0.5)
        return x


def make(seed=0):
    torch.manual_seed(seed)
    return Stack(), torch.randn(8, 32, 64)


def loss_of(model, x):
    return lambda: model(x).square().mean()


def test_checkpointing_keeps_outputs_gradients_and_parameter_names():
    plain, x = make()
    ckpt = copy.deepcopy(plain)
    assert apply_gradient_checkpointing(ckpt.layers, every_n_blocks=1) == [0, 1, 2, 3]
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    loss_of(plain, x)().backward()
    loss_of(ckpt, x)().backward()
    for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=0, rtol=0)


def test_checkpointed_blocks_really_run_again_in_the_backward():
    model, x = make()
    apply_gradient_checkpointing(model.layers, every_n_blocks=2)
    Block.calls = 0
    loss = loss_of(model, x)()
    assert Block.calls == 4
    loss.backward()
    assert Block.calls == 6  # blocks 0 and 2 recomputed
    with torch.no_grad():
        Block.calls = 0
        model(x)
    assert Block.calls == 4  # no recomputation machinery without gradients


def test_checkpointing_lowers_saved_activation_memory():
    model, x = make()
    params = list(model.parameters())
    report = peak_memory_with_and_without(
        model.layers, loss_of(model, x), every_n_blocks=1, device="cpu", exclude=params
    )
    assert report.without.estimated and report.without.method == "saved_tensor_bytes"
    # per block: up (8 KiB-ish rows x 256) + gelu + down inputs ~ 0.75 MiB;
    # checkpointing keeps the inputs
    assert report.without.bytes > 2 * 2**20
    assert report.with_checkpointing.bytes < 0.25 * report.without.bytes
    assert report.saved_fraction > 0.75
    assert all(is_checkpointed(b) for b in model.layers)
    half = copy.deepcopy(model)
    remove_gradient_checkpointing(half.layers)
    apply_gradient_checkpointing(half.layers, every_n_blocks=2)
    every_other = measure_peak_memory(
        loss_of(half, x), device="cpu", exclude=list(half.parameters())
    )
    assert report.with_checkpointing.bytes < every_other.bytes < report.without.bytes


def test_removing_checkpointing_restores_the_plain_forward():
    model, x = make()
    apply_gradient_checkpointing(model.layers, every_n_blocks=1)
    remove_gradient_checkpointing(model.layers)
    assert not any(is_checkpointed(b) for b in model.layers)
    Block.calls = 0
    loss_of(model, x)().backward()
    assert Block.calls == 4


def test_a_deep_copy_checkpoints_its_own_blocks():
    model, x = make()
    apply_gradient_checkpointing(model.layers, every_n_blocks=1)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    assert clone(x).sub(x).abs().max() == 0  # zeroed copy: residual only, the original is untouched
    assert model(x).sub(x).abs().max() > 0


def test_every_n_blocks_must_be_positive():
    with pytest.raises(ValueError, match="memory.gradient_checkpointing.every_n_blocks"):
        apply_gradient_checkpointing(make()[0].layers, every_n_blocks=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_memory_is_lower_with_checkpointing():
    torch.manual_seed(0)
    model = Stack(n=8, dim=256).cuda()
    x = torch.randn(16, 512, 256, device="cuda")
    report = peak_memory_with_and_without(
        model.layers, loss_of(model, x), every_n_blocks=1, device="cuda"
    )
    assert not report.without.estimated
    assert report.with_checkpointing.bytes < 0.5 * report.without.bytes
