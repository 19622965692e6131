import os
import sys

import pytest
import torch
from torch import nn

from gpu_runtime.strategies.offload import (
    CpuOffloadedEmbedding,
    OffloadError,
    embedding_from_file,
    load_tensors,
    offload_embeddings,
    parameters_by_device,
    save_tensors,
)


class TinyLM(nn.Module):
    def __init__(self, vocab=50, dim=8, tie=False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.tok_embeddings.weight

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.tok_embeddings(ids))))


def ids_batch(vocab=50):
    return torch.randint(0, vocab, (3, 5), generator=torch.Generator().manual_seed(0))


def file_backed(tensor, path):
    """True when the tensor's bytes lie in a mapping of `path` (Linux /proc/self/maps)."""
    address, target = tensor.data_ptr(), os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(v, 16) for v in fields[0].split("-"))
            if len(fields) == 6 and fields[5].strip() == target and start <= address < end:
                return True
    return False


def test_embedding_table_stays_on_cpu_when_the_model_moves():
    torch.manual_seed(0)
    model = TinyLM()
    assert offload_embeddings(model, target="cpu") == ["tok_embeddings"]
    assert isinstance(model.tok_embeddings, CpuOffloadedEmbedding)
    before = model.tok_embeddings.weight.detach().clone()
    model.to("meta")  # stands in for the accelerator on this CPU-only machine
    assert model.proj.weight.device.type == "meta"
    assert model.tok_embeddings.weight.device.type == "cpu"
    assert torch.equal(model.tok_embeddings.weight.detach(), before)
    assert model.tok_embeddings.output_device == torch.device(
        "meta"
    )  # rows go where the model went
    model.to(torch.float64)
    assert model.tok_embeddings.output_device == torch.device("meta")  # a cast is not a move


def test_a_dtype_cast_still_reaches_the_offloaded_table():
    model = TinyLM()
    offload_embeddings(model, target="cpu")
    model.to(torch.bfloat16)
    assert model.tok_embeddings.weight.dtype == torch.bfloat16
    assert model.tok_embeddings.weight.device.type == "cpu"
    assert model.tok_embeddings.output_device is None
    model.cpu()
    assert model.tok_embeddings.output_device == torch.device("cpu")


def test_offloaded_embedding_trains_like_the_original_with_cpu_optimizer_state():
    torch.manual_seed(0)
    reference = TinyLM()
    model = TinyLM()
    model.load_state_dict(reference.state_dict())
    offload_embeddings(model, target="cpu")
    assert set(model.state_dict()) == set(reference.state_dict())
    ids = ids_batch()
    for m in (reference, model):
        m(ids).logsumexp(-1).mean().backward()
    torch.testing.assert_close(
        model.tok_embeddings.weight.grad, reference.tok_embeddings.weight.grad
    )
    optimizers = [torch.optim.AdamW(ps, lr=1e-2) for ps in parameters_by_device(model).values()]
    for opt in optimizers:
        opt.step()
    state = optimizers[0].state[model.tok_embeddings.weight]
    assert state["exp_avg"].device.type == "cpu" and state["exp_avg_sq"].device.type == "cpu"


def test_npu_target_is_a_clear_error():
    with pytest.raises(OffloadError, match=r"offload\.embedding: 'npu' is not available"):
        offload_embeddings(TinyLM(), target="npu")


def test_unknown_target_and_missing_names_are_errors():
    with pytest.raises(OffloadError, match="offload.embedding"):
        offload_embeddings(TinyLM(), target="disk")
    with pytest.raises(OffloadError, match="no nn.Embedding named"):
        offload_embeddings(TinyLM(), target="cpu", names=["embed"])


def test_none_leaves_the_model_alone():
    model = TinyLM()
    assert offload_embeddings(model, target="none") == []
    assert type(model.tok_embeddings) is nn.Embedding


def test_tied_embedding_refuses_to_offload():
    with pytest.raises(OffloadError, match="tied to .*lm_head.weight"):
        offload_embeddings(TinyLM(tie=True), target="cpu")


def test_mmap_loading_maps_the_file_instead_of_copying(tmp_path):
    path = tmp_path / "state.pt"
    save_tensors({"table": torch.randn(1024, 64), "step": 7}, path)
    mapped = load_tensors(path, mmap=True)
    copied = load_tensors(path, mmap=False)
    assert mapped["step"] == 7
    assert file_backed(mapped["table"], path)
    assert not file_backed(copied["table"], path)
    torch.testing.assert_close(mapped["table"], copied["table"])
    mapped["table"][0].zero_()  # private mapping: the file keeps its bytes
    torch.testing.assert_close(load_tensors(path, mmap=False)["table"], copied["table"])


def test_embedding_table_from_a_mapped_file_trains_without_touching_the_file(tmp_path):
    path = tmp_path / "embedding.pt"
    table = torch.randn(50, 8)
    save_tensors({"tok_embeddings.weight": table}, path)
    embedding = embedding_from_file(path, "tok_embeddings.weight", mmap=True)
    assert file_backed(embedding.weight, path)
    torch.testing.assert_close(embedding(ids_batch()), table[ids_batch()])
    opt = torch.optim.AdamW(embedding.parameters(), lr=0.1)
    embedding(ids_batch()).sum().backward()
    opt.step()
    assert not torch.equal(embedding.weight.detach(), table)
    torch.testing.assert_close(load_tensors(path, mmap=False)["tok_embeddings.weight"], table)
    with pytest.raises(OffloadError, match="holds no tensor"):
        embedding_from_file(path, "missing", mmap=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_proc_maps_probe_sees_plain_memory_as_not_mapped(tmp_path):
    path = tmp_path / "x.pt"
    save_tensors({"x": torch.ones(4)}, path)
    assert not file_backed(torch.ones(4), path)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_rows_cross_pinned_and_only_the_table_stays_behind():
    torch.manual_seed(0)
    reference = TinyLM().cuda()
    model = TinyLM()
    model.load_state_dict(reference.state_dict())
    offload_embeddings(model, target="cpu")
    model.cuda()
    assert model.proj.weight.is_cuda and model.tok_embeddings.weight.device.type == "cpu"
    ids = ids_batch()
    out = model(ids)  # ids stay on the CPU: no device-to-host copy
    assert out.is_cuda
    out.logsumexp(-1).mean().backward()
    reference(ids.cuda()).logsumexp(-1).mean().backward()
    torch.testing.assert_close(
        model.tok_embeddings.weight.grad, reference.tok_embeddings.weight.grad.cpu()
    )
    groups = parameters_by_device(model)
    assert {d.type for d in groups} == {"cpu", "cuda"}
