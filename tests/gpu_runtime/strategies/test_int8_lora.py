import pytest
import torch
from torch import nn

from gpu_runtime.strategies.quantization import (
    Int8WeightOnlyLinear,
    LoraInt8Linear,
    QuantizationError,
    quantize_for_lora,
    quantize_int8,
)

TARGETS = ["q_proj", "v_proj", "o_proj"]


class Attention(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.v_proj, self.o_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return x + self.o_proj(torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v)


class TwoLayer(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.layers = nn.ModuleList(Attention(dim) for _ in range(2))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).squeeze(-1)


def data():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(16, 6, 64, generator=gen), torch.randn(16, 6, generator=gen)


def test_int8_is_symmetric_per_output_channel():
    w = torch.randn(8, 32) * torch.linspace(0.1, 10, 8)[:, None]
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (8,)
    torch.testing.assert_close(scale, w.abs().amax(1) / 127)
    assert q.abs().max() == 127
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()


def test_targets_become_frozen_int8_with_trainable_adapters():
    torch.manual_seed(0)
    model = TwoLayer()
    report = quantize_for_lora(model, target_modules=TARGETS, lora_rank=4, lora_alpha=8)
    assert report.backend == "torch"
    assert report.modules == [f"layers.{i}.{t}" for i in range(2) for t in TARGETS]
    assert isinstance(model.layers[0].k_proj, nn.Linear)  # not a target
    for name in report.modules:
        layer = model.get_submodule(name)
        assert isinstance(layer, LoraInt8Linear)
        assert layer.base.weight_int8.dtype == torch.int8
        assert list(layer.base.parameters()) == []  # buffers only: nothing to train
        assert layer.lora_a.requires_grad and layer.lora_b.requires_grad
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any("weight_int8" in n or "base" in n for n in trainable)


def test_adapters_train_while_int8_weights_stay_put():
    torch.manual_seed(0)
    model = TwoLayer()
    quantize_for_lora(model, target_modules=TARGETS, lora_rank=4, lora_alpha=8)
    frozen = {n: b.clone() for n, b in model.named_buffers()}
    lora_b = model.layers[0].q_proj.lora_b.detach().clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x, y = data()
    losses = []
    for _ in range(15):
        loss = (model(x) - y).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(torch.equal(b, frozen[n]) for n, b in model.named_buffers())
    assert not torch.equal(model.layers[0].q_proj.lora_b.detach(), lora_b)


def test_quantized_layer_starts_as_the_original_up_to_int8_error():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    layer = LoraInt8Linear(linear, rank=4, alpha=8, backend="torch")
    x = torch.randn(10, 64)
    want = linear(x)
    got = layer(x)  # B = 0: only the int8 base speaks
    assert (got - want).norm() / want.norm() < 0.01
    deq = nn.functional.linear(x, layer.base.dequantized_weight(), linear.bias)
    torch.testing.assert_close(got, deq, atol=1e-5, rtol=1e-5)


def test_weight_bytes_saved_are_reported():
    model = TwoLayer()
    report = quantize_for_lora(model, target_modules=TARGETS)
    assert report.weight_bytes_before == 6 * 64 * 64 * 4
    assert report.weight_bytes_after == 6 * (64 * 64 + 64 * 4)
    assert report.weight_bytes_saved == report.weight_bytes_before - report.weight_bytes_after
    assert report.weight_bytes_saved / report.weight_bytes_before > 0.7
    assert report.adapter_bytes == 6 * (8 * 64 + 64 * 8) * 4


def test_backward_keeps_the_int8_weight_not_a_float_copy():
    layer = Int8WeightOnlyLinear(nn.Linear(64, 128, bias=False))
    saved = []
    x = torch.randn(4, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = layer(x)
    assert not any(t.shape == (128, 64) and t.is_floating_point() for t in saved)
    out.sum().backward()
    torch.testing.assert_close(x.grad, layer.dequantized_weight().sum(0).expand(4, 64))


def test_autocast_runs_the_int8_path_in_bf16():
    model = TwoLayer()
    quantize_for_lora(model, target_modules=TARGETS)
    x, _ = data()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.layers[0].q_proj(x)
    assert out.dtype == torch.bfloat16


def test_full_finetuning_of_a_quantized_module_is_refused():
    with pytest.raises(
        QuantizationError, match=r"full fine-tuning of quantized modules.*layers\.0\.q_proj"
    ):
        quantize_for_lora(TwoLayer(), target_modules=TARGETS, full_finetune=True)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        (dict(weight_bits=4), "weight_bits"),
        (dict(target_modules=["q_proj", "qkv"]), "target_modules"),
        (dict(lora_rank=0), "lora_rank"),
        (dict(backend="gptq"), "backend"),
    ],
)
def test_bad_requests_name_the_key(kwargs, key):
    with pytest.raises(QuantizationError, match=key):
        quantize_for_lora(TwoLayer(), **{"target_modules": TARGETS, **kwargs})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bitsandbytes_backend_on_cuda():
    pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    model = TwoLayer().cuda().half()
    report = quantize_for_lora(model, target_modules=TARGETS)
    assert report.backend == "bitsandbytes"
    x, y = (t.cuda() for t in data())
    loss = (model(x.half()).float() - y).square().mean()
    loss.backward()
    assert model.layers[0].q_proj.lora_a.grad is not None
    assert report.weight_bytes_saved > 0
