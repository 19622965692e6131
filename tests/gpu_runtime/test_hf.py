"""A team's own Hugging Face checkpoint: read, refused, loaded into costlab's model or
wrapped, and saved back; all on tiny checkpoints built here (nothing is downloaded)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from gpu_runtime import hf, tinyhf  # noqa: E402
from gpu_runtime.errors import StrategyError  # noqa: E402
from gpu_runtime.model import ModelArgs, Transformer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SEQ = 32


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(arch, **kwargs) -> a tiny checkpoint directory, built once per module."""
    made: dict[str, Path] = {}

    def _build(arch: str, **kwargs) -> Path:
        key = arch + json.dumps(kwargs, sort_keys=True, default=str)
        if key not in made:
            out = tmp_path_factory.mktemp(arch)
            made[key] = tinyhf.build_checkpoint(out, arch, seq_len=64, **kwargs)
        return made[key]

    return _build


def _reference(path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), local_files_only=True, dtype=torch.float32
    ).eval()


def _ids(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def _logits(module, idx) -> torch.Tensor:
    with torch.no_grad():
        return module.eval()(idx)[0]


def _errors(exc: pytest.ExceptionInfo) -> list[dict[str, str]]:
    return exc.value.errors


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


# --- parity with transformers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "kwargs"),
    [
        ("llama", {}),
        ("mistral", {"heads": 8, "kv_heads": 2}),  # grouped-query attention
        ("qwen2", {"tie": True}),  # q/k/v biases, tied embeddings
        ("llama", {"head_dim": 24}),  # head_dim != hidden / heads
    ],
)
def test_native_logits_match_transformers(build, arch, kwargs):
    path = build(arch, **kwargs)
    loaded = hf.load_model(str(path), SEQ, init="checkpoint", seed=0)
    assert loaded.native and isinstance(loaded.module, Transformer)
    assert loaded.model_type == arch and loaded.args is loaded.module.args
    assert loaded.args.rope_style == "half"
    ref = _reference(path)
    idx = _ids(ref.config.vocab_size)
    ours, theirs = _logits(loaded.module, idx), _logits(ref, idx)
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert loaded.module.args.num_params() == sum(p.numel() for p in ref.parameters())
    if arch == "mistral":
        assert loaded.args.kv_heads == 2 < loaded.args.n_heads
    if arch == "qwen2":
        attn = loaded.module.blocks[0].attn
        assert attn.q_proj.bias is not None and attn.o_proj.bias is None
        assert loaded.module.output.weight is loaded.module.tok_embeddings.weight
    if "head_dim" in kwargs:
        assert loaded.args.head_dim == 24 and loaded.module.blocks[0].attn.q_proj.out_features == 96


def test_a_sharded_checkpoint_loads_like_the_single_file(build):
    single, sharded = build("qwen2"), build("qwen2", shard_size="100KB")
    assert len(hf.read_checkpoint(str(sharded)).weight_files) > 1
    assert hf.read_checkpoint(str(sharded)).sharded
    assert not hf.read_checkpoint(str(single)).sharded
    a = hf.load_model(str(single), SEQ, init="checkpoint", seed=0).module
    b = hf.load_model(str(sharded), SEQ, init="checkpoint", seed=0).module
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_half_precision_weights_load_as_fp32(build):
    path = build("llama", dtype=torch.bfloat16)
    model = hf.load_model(str(path), SEQ, init="checkpoint", seed=0).module
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ref = _reference(path)
    idx = _ids(ref.config.vocab_size)
    assert (_logits(model, idx) - _logits(ref, idx)).abs().max().item() <= 1e-4


def test_fused_rmsnorm_qkv_adds_qwen2_biases(build):
    from gpu_runtime.assembly import install_fused_rmsnorm_qkv

    model = hf.load_model(str(build("qwen2", tie=True)), SEQ, init="checkpoint", seed=0).module
    idx = _ids(model.args.vocab_size)
    before = _logits(model, idx)
    assert install_fused_rmsnorm_qkv(model, backend="function") == model.args.n_layers
    assert (_logits(model, idx) - before).abs().max().item() <= 1e-5


# --- another architecture, through transformers --------------------------------------------


def test_gpt2_trains_through_transformers_with_costlabs_contract(build):
    path = build("gpt2")
    loaded = hf.load_model(str(path), SEQ, init="checkpoint", seed=0)
    module = loaded.module
    assert not loaded.native and loaded.args is None and isinstance(module, hf.HFCausalLM)
    assert module.model_type == "gpt2" and (module.n_layers, module.dim) == (2, 64)
    ref = _reference(path)
    idx = _ids(ref.config.vocab_size)
    assert (_logits(module, idx) - _logits(ref, idx)).abs().max().item() <= 1e-5
    # parameters: the module's own; without embeddings, the position table drops out and the
    # tied token table stays (it is the output head)
    total = sum(p.numel() for p in ref.parameters())
    assert module.num_params(embedding=True) == total
    n = total - ref.transformer.wpe.weight.numel()
    assert module.num_params(embedding=False) == n == module.num_trainable()
    assert module.flops_per_token(SEQ) == 6 * n + 12 * 2 * 64 * SEQ
    assert module.flops_per_token(SEQ, trainable=10) == 4 * n + 20 + 12 * 2 * 64 * SEQ
    # the loss ignores -100 targets, and is 0 (not NaN) when every target is ignored
    module.train()
    targets = _ids(ref.config.vocab_size, seed=1)
    targets[:, ::2] = -100
    logits, loss = module(idx, targets)
    keep = targets != -100
    expected = F.cross_entropy(logits[keep].float(), targets[keep])
    assert loss.dtype == torch.float32 and torch.isclose(loss, expected, atol=1e-6)
    _, none = module(idx, torch.full_like(targets, -100))
    assert none.item() == 0.0
    none.backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


# --- saving back in transformers' layout ------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"tie": True}])
def test_hf_state_dict_round_trips_through_transformers(build, tmp_path, kwargs):
    from safetensors.torch import save_file

    source = build("qwen2", **kwargs)
    model = hf.load_model(str(source), SEQ, init="checkpoint", seed=0).module
    with torch.no_grad():  # "trained": not the weights the source directory holds
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    state = hf.hf_state_dict(model)
    assert ("lm_head.weight" in state) is not kwargs.get("tie", False)
    out = tmp_path / "saved"
    out.mkdir()
    shutil.copyfile(source / "config.json", out / "config.json")
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    idx = _ids(model.args.vocab_size)
    assert (_logits(_reference(out), idx) - _logits(model, idx)).abs().max().item() <= 1e-4
    again = hf.load_model(str(out), SEQ, init="checkpoint", seed=0).module
    assert torch.equal(_logits(again, idx), _logits(model, idx))


# --- init scratch ------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_scratch_has_the_checkpoints_shapes_not_its_weights(build, arch):
    path = str(build(arch))
    loaded = hf.load_model(path, SEQ, init="checkpoint", seed=0).module.state_dict()
    # seeds other than the checkpoint's own (0): a tiny checkpoint is itself a seeded init
    scratch = hf.load_model(path, SEQ, init="scratch", seed=1).module.state_dict()
    same_seed = hf.load_model(path, SEQ, init="scratch", seed=1).module.state_dict()
    other_seed = hf.load_model(path, SEQ, init="scratch", seed=2).module.state_dict()
    assert list(loaded) == list(scratch)
    assert all(loaded[k].shape == scratch[k].shape for k in loaded)
    weights = [k for k in loaded if loaded[k].dim() == 2]
    assert all(not torch.equal(loaded[k], scratch[k]) for k in weights)
    assert all(torch.equal(scratch[k], same_seed[k]) for k in scratch)
    assert any(not torch.equal(scratch[k], other_seed[k]) for k in weights)


# --- refusals -----------------------------------------------------------------------------------


def _refused(path, seq_len: int = SEQ, key: str = "model.path") -> str:
    with pytest.raises(StrategyError) as exc:
        hf.load_model(str(path), seq_len, init="checkpoint", seed=0)
    errors = _errors(exc)
    assert [e["key"] for e in errors] == [key], errors
    return errors[0]["message"]


def test_refuses_paths_that_are_not_a_local_checkpoint(tmp_path):
    assert "no directory" in _refused(tmp_path / "missing")
    message = _refused("meta-llama/Llama-2-7b-hf")
    assert "hub id" in message and "never downloads" in message
    assert "remote" in _refused("https://example.invalid/model")
    (tmp_path / "file.txt").write_text("x")
    assert "is a file" in _refused(tmp_path / "file.txt")
    assert "no config.json" in _refused(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert "not readable JSON" in _refused(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert "no model_type" in _refused(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]})
    )
    assert "no causal language model" in _refused(tmp_path)


def test_refuses_checkpoints_without_safetensors(build, tmp_path):
    path = _copy(build("llama"), tmp_path / "pickled")
    (path / "model.safetensors").unlink()
    assert "no weights" in _refused(path)
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    message = _refused(path)
    assert "pickle" in message and "convert it to safetensors" in message


def test_refuses_a_missing_shard(build, tmp_path):
    path = _copy(build("qwen2", shard_size="100KB"), tmp_path / "partial")
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.unlink()
    message = _refused(path)
    assert "missing" in message and shard.name in message


def test_refuses_seq_len_beyond_the_checkpoints_positions(build):
    for arch in ("llama", "gpt2"):
        message = _refused(build(arch), seq_len=128, key="model.seq_len")
        assert "64" in message and "seq_len" in message


@pytest.mark.parametrize(
    ("changes", "key", "words"),
    [
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
         "model.path", "rope_type"),
        ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}},
         "model.path", "rope_scaling"),
        ({"attention_bias": True}, "model.path", "o_proj"),
        ({"mlp_bias": True}, "model.path", "mlp_bias"),
        ({"hidden_act": "gelu"}, "model.path", "hidden_act"),
        ({"intermediate_size": 96}, "model.path", "shape"),
        ({"num_hidden_layers": 3}, "model.path", "model.layers.2"),
        ({"tie_word_embeddings": True}, "model.path", "different lm_head.weight"),
    ],
)  # fmt: skip
def test_refuses_llama_configs_costlab_cannot_compute(build, tmp_path, changes, key, words):
    path = _copy(build("llama"), tmp_path / "edited")
    _edit_config(path, **changes)
    assert words in _refused(path, key=key)


def test_legacy_rope_theta_and_a_missing_tied_head(build, tmp_path):
    path = _copy(build("llama"), tmp_path / "legacy")
    _edit_config(path, rope_parameters=None, rope_theta=12345.0)
    assert hf.native_args(hf.read_checkpoint(str(path)), SEQ).rope_theta == 12345.0
    untied = _copy(build("qwen2", tie=True), tmp_path / "untied")
    _edit_config(untied, tie_word_embeddings=False)
    assert "lm_head.weight" in _refused(untied)


def test_refuses_a_sliding_window_shorter_than_seq_len(build, tmp_path):
    path = _copy(build("mistral"), tmp_path / "window")
    _edit_config(path, sliding_window=16)
    assert "sliding_window" in _refused(path, key="model.seq_len")
    assert hf.load_model(str(path), 16, init="checkpoint", seed=0).native


# --- counts and FLOPs ------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True])
def test_num_params_counts_the_built_module(tie):
    args = ModelArgs(
        dim=48, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, vocab_size=100,
        qkv_bias=True, tie_embeddings=tie, head_dim_override=16, rope_style="half",
    )  # fmt: skip
    model = Transformer(args)
    total = sum(p.numel() for p in model.parameters())
    table = 100 * 48
    assert args.num_params() == total
    assert args.num_params(embedding=False) == (total if tie else total - table)
    assert model.num_trainable() == args.num_params(embedding=False)
    logits, loss = model(torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 8)))
    assert logits.shape == (2, 8, 100) and torch.isfinite(loss)


def test_flops_per_token_counts_weight_gradients_of_trainable_params_only():
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=100)
    n, attention = args.num_params(embedding=False), 12 * 2 * 64 * 256
    assert args.flops_per_token(256) == 6 * n + attention
    assert args.flops_per_token(256, trainable=None) == args.flops_per_token(256)
    assert args.flops_per_token(256, trainable=1000) == 2 * n + 2 * n + 2 * 1000 + attention
    assert args.flops_per_token(256, trainable=0) == 4 * n + attention


def test_loss_ignores_minus_100_and_is_zero_when_all_are_ignored():
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=32, n_layers=1, n_heads=2, hidden_dim=64, max_seq_len=8))
    idx, targets = torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 8))
    targets[0, :5] = -100
    logits, loss = model(idx, targets)
    keep = targets != -100
    assert torch.isclose(loss, F.cross_entropy(logits[keep], targets[keep]), atol=1e-6)
    _, zero = model(idx, torch.full_like(targets, -100))
    assert zero.item() == 0.0 and not math.isnan(zero.item())


# --- tiny checkpoints ---------------------------------------------------------------------------


def test_tiny_tokenizer_is_deterministic_and_the_cli_builds_a_loadable_checkpoint(tmp_path):
    texts = ["the quick brown fox jumps over the lazy dog"] * 20
    a = tinyhf.build_tokenizer(tmp_path / "a", vocab_size=300, texts=texts)
    b = tinyhf.build_tokenizer(tmp_path / "b", vocab_size=300, texts=texts)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(str(a), local_files_only=True)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert tok.decode(tok.encode("the lazy fox", add_special_tokens=False)) == "the lazy fox"
    out = tinyhf.main(
        ["--arch", "mistral", "--layers", "1", "--seq-len", "64", str(tmp_path / "c")]
    )
    ckpt = hf.read_checkpoint(str(out))
    assert ckpt.model_type == "mistral" and (out / "tokenizer.json").is_file()


@pytest.mark.slow
def test_importing_hf_does_not_import_transformers():
    code = "import sys, gpu_runtime.hf; assert 'transformers' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_refuses_a_foreign_checkpoint_whose_weights_miss_layers(build, tmp_path):
    path = _copy(build("gpt2"), tmp_path / "deeper")
    _edit_config(path, n_layer=3)
    message = _refused(path)
    assert "missing" in message and "h.2." in message


def test_math_attention_on_a_transformers_model_is_its_eager_attention(build):
    """kernels.attention: math on an architecture trained through transformers switches it to
    transformers' eager attention: the same logits as its SDPA."""
    from gpu_runtime.assembly import install_attention

    module = hf.load_model(str(build("gpt2")), SEQ, init="checkpoint", seed=0).module
    idx = _ids(module.hf.config.vocab_size)
    before = _logits(module, idx)
    assert module.hf.config._attn_implementation == "sdpa"
    report = install_attention(module, "math")
    assert report == {"implementation": "math", "attn_implementation": "eager"}
    assert module.hf.config._attn_implementation == "eager"
    assert (_logits(module, idx) - before).abs().max().item() <= 1e-5
