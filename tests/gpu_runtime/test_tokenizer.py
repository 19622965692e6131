"""Tokenizers: bytes, a checkpoint's own (a tiny BPE trained here on the shipped dataset), chat
rendering with and without a chat template, and corpora tokenized by them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpu_runtime
from gpu_runtime.data import StepBatches, load_corpus, split_batch, trained_tokens
from gpu_runtime.errors import StrategyError
from gpu_runtime.model import BOS, EOS, PAD, VOCAB_SIZE
from gpu_runtime.schema import DataSection
from gpu_runtime.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    encode_segments,
    load_tokenizer,
)
from tests.gpu_runtime.test_data import packed_rows_suffix

DATASETS = Path(gpu_runtime.__file__).parent / "datasets"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "It is 5."},
    {"role": "user", "content": "Sure?"},
    {"role": "assistant", "content": "Yes, 5."},
]


def _bpe(chat_template: str | None = None):
    """A PreTrainedTokenizerFast: byte-level BPE (400 ids) trained on the shipped Alpaca data."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = []
    for line in (DATASETS / "instructions.jsonl").open(encoding="utf-8"):
        record = json.loads(line)
        texts += [record["instruction"], record["input"], record["output"]]
    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    if chat_template is not None:
        hf.chat_template = chat_template
    return hf


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, str]:
    """Two saved tokenizer directories: plain, and with a chat template."""
    plain, templated = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("templated")
    _bpe().save_pretrained(str(plain))
    _bpe(TEMPLATE).save_pretrained(str(templated))
    return {"plain": str(plain), "templated": str(templated)}


@pytest.fixture(scope="module")
def plain(saved) -> HFTokenizer:
    return load_tokenizer(saved["plain"])


@pytest.fixture(scope="module")
def templated(saved) -> HFTokenizer:
    return load_tokenizer(saved["templated"])


def _response_text(tok: HFTokenizer, ids: list[int], mask: list[bool]) -> str:
    return tok.hf.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_the_byte_tokenizer_is_todays_ids():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert (tok.name, tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (
        "bytes",
        VOCAB_SIZE,
        BOS,
        EOS,
        PAD,
    )
    assert tok.encode("h\u00e9") == list("h\u00e9".encode())
    segments = tok.render_chat(CONVERSATION[1:3])
    assert segments == [
        ("<|user|>\nAdd 2 and 3.\n<|assistant|>\n", False),
        ("It is 5.<|end|>", True),
    ]


@pytest.mark.slow
def test_the_tokenizer_and_data_modules_import_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None; sys.modules['tokenizers'] = None\n"
        "from gpu_runtime.data import load_corpus\n"
        "from gpu_runtime.schema import DataSection\n"
        "from gpu_runtime.tokenizer import ByteTokenizer\n"
        "assert load_corpus(DataSection(), seed=0).tokenizer == ByteTokenizer.name\n"
    )
    root = Path(gpu_runtime.__file__).parent.parent
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=120)


def test_a_saved_tokenizer_loads_offline(plain):
    assert isinstance(plain, Tokenizer)
    assert plain.vocab_size == len(plain.hf) == 400
    assert (plain.bos_id, plain.eos_id, plain.pad_id) == (0, 1, 2)
    ids = plain.encode("The sum of 3 and 4 is 7.")
    assert plain.bos_id not in ids and plain.hf.decode(ids) == "The sum of 3 and 4 is 7."
    assert len(ids) < len("The sum of 3 and 4 is 7.")  # merges learned from the dataset


def test_pad_falls_back_to_eos_then_zero(tmp_path):
    hf = _bpe()
    hf.pad_token = None
    assert HFTokenizer(hf).pad_id == hf.eos_token_id
    hf.eos_token = None
    assert HFTokenizer(hf).pad_id == 0 and HFTokenizer(hf).eos_id is None


def test_a_directory_without_tokenizer_files_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    for path in (tmp_path, tmp_path / "missing"):
        with pytest.raises(StrategyError) as info:
            load_tokenizer(str(path))
        error = info.value.errors[0]
        assert error["key"] == "model.path" and "no tokenizer" in error["message"]
        assert "tokenizer.json" in error["message"]


def test_without_a_template_the_builtin_one_ends_turns_with_eos(plain):
    segments = plain.render_chat(CONVERSATION)
    assert [s for s, response in segments if response] == ["It is 5.</s>", "Yes, 5.</s>"]
    ids, mask = encode_segments(plain, segments)
    assert ids.count(plain.eos_id) == 2  # the EOS text is the EOS token
    assert _response_text(plain, ids, mask) == "It is 5.</s>Yes, 5.</s>"


def test_a_chat_template_marks_exactly_the_assistant_turns(templated):
    segments = templated.render_chat(CONVERSATION)
    full = templated.hf.apply_chat_template(CONVERSATION, tokenize=False)
    assert "".join(s for s, _ in segments) == full
    assert segments == [
        ("<|system|>Be brief.</s><|user|>Add 2 and 3.</s><|assistant|>", False),
        ("It is 5.</s>", True),  # the assistant's content and the template's end of turn
        ("<|user|>Sure?</s><|assistant|>", False),
        ("Yes, 5.</s>", True),
    ]
    ids, mask = encode_segments(templated, segments)
    assert ids == templated.encode(full)  # one tokenization of the whole text
    assert _response_text(templated, ids, mask) == "It is 5.</s>Yes, 5.</s>"


def test_a_template_that_is_not_prefix_stable_falls_back_to_the_content(saved):
    tail = "{{ '<|turns|>' ~ (messages | length) }}"  # changes as the conversation grows
    hf = _bpe(TEMPLATE + tail)
    segments = HFTokenizer(hf).render_chat(CONVERSATION)
    assert [s for s, response in segments if response] == ["It is 5.", "Yes, 5."]
    assert segments[-1] == ("</s><|turns|>5", False)


def test_a_chat_corpus_with_the_templated_tokenizer(templated, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n", encoding="utf-8")
    section = DataSection(source="jsonl", path=str(path), format="chat", loss_on="response")
    corpus = load_corpus(section, seed=0, tokenizer=templated)
    assert corpus.tokens.dtype == torch.int16 and corpus.tokenizer == templated.name
    plain_ids = torch.where(corpus.tokens < 0, ~corpus.tokens, corpus.tokens).tolist()
    full = templated.hf.apply_chat_template(CONVERSATION, tokenize=False)
    assert plain_ids == [templated.bos_id, *templated.encode(full)]  # ends in </s>: no second EOS
    _, targets = split_batch(corpus.tokens.long()[None])
    trained = [t for t in targets[0].tolist() if t >= 0]
    assert templated.hf.decode(trained) == "It is 5.</s>Yes, 5.</s>"
    # any other tokenizer hashes the stored stream as int32 little-endian (then, packed records:
    # their offsets and a tag)
    stream = b"".join(t.to_bytes(4, "little", signed=True) for t in corpus.tokens.tolist())
    assert corpus.sha256 == hashlib.sha256(stream + packed_rows_suffix(corpus)).hexdigest()


def test_the_shipped_datasets_through_a_checkpoint_tokenizer(plain):
    alpaca_path = str(DATASETS / "instructions.jsonl")
    full = load_corpus(DataSection(source="jsonl", path=alpaca_path), seed=0, tokenizer=plain)
    masked = load_corpus(
        DataSection(source="jsonl", path=alpaca_path, loss_on="response", packing=False),
        seed=0,
        tokenizer=plain,
    )
    assert full.description == f"alpaca(400 records; tokenizer {plain.name})"
    assert full.sha256 != masked.sha256 and full.trained_fraction == 1.0
    first = json.loads((DATASETS / "instructions.jsonl").open().readline())
    start, end = masked.records[:2].tolist()
    row = masked.tokens[start:end].long()[None]
    _, targets = split_batch(row)
    assert plain.hf.decode([t for t in targets[0].tolist() if t >= 0]) == first["output"] + "</s>"
    batch = StepBatches(masked, seq_len=96, global_batch=4, seed=0).batch(0)
    assert 0 < trained_tokens(batch) < 4 * 96 and int(split_batch(batch)[0].max()) < 400
    chat = load_corpus(
        DataSection(source="jsonl", path=str(DATASETS / "chat.jsonl"), format="chat"),
        seed=0,
        tokenizer=plain,
    )
    assert chat.description.startswith("chat(300 records") and chat.tokens.numel() > 10_000
