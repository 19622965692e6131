"""Tokenizers: today's byte ids, or the tokenizer saved next to a team's own checkpoint.

Every tokenizer meets one small protocol (``Tokenizer``): a name, the embedding rows a
model needs, its BOS/EOS/PAD ids, ``encode`` (text to ids, no special tokens added) and
``render_chat`` (a conversation to ``(text, is_response)`` segments, where only the
assistant turns are responses).

``ByteTokenizer`` is the ``llama`` family's: UTF-8 bytes, BOS/EOS/PAD from
``gpu_runtime.model``. ``HFTokenizer`` wraps a ``transformers`` tokenizer; ``load_tokenizer``
reads one from a local directory only (never the network). ``transformers`` is imported
lazily, in ``load_tokenizer``, so this module imports without it.

Chat rendering: a tokenizer with a ``chat_template`` renders with it; the response segments
are found by rendering prefixes of the conversation (up to each assistant turn, with the
generation prompt, and through it), so they are exactly the text the template writes for
each assistant turn (its content and end-of-turn marker). Templates whose prefixes are not
prefixes of the whole rendering fall back to finding the assistant's content verbatim.
Without a template, the built-in one is used::

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n{content}{end}

where ``{end}`` is the EOS token's text (``<|end|>`` for bytes, or a tokenizer without EOS)
and only each assistant's ``{content}{end}`` is response.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpu_runtime.errors import StrategyError
from gpu_runtime.model import BOS, EOS, PAD, VOCAB_SIZE

CHAT_ROLES = ("system", "user", "assistant")
BYTE_END = "<|end|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

Segments = list[tuple[str, bool]]


@runtime_checkable
class Tokenizer(Protocol):
    name: str  # "bytes", or the checkpoint tokenizer's class name
    vocab_size: int  # embedding rows a model needs (max id + 1)
    bos_id: int | None
    eos_id: int | None
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def render_chat(self, messages: list[dict]) -> Segments: ...


def builtin_chat(messages: Sequence[dict], end: str) -> Segments:
    """The plain template: role headers, and each assistant turn's content + ``end`` as
    response."""
    segments: Segments = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if role == "assistant":
            segments.append(("<|assistant|>\n", False))
            segments.append((content + end, True))
            if i != last:
                segments.append(("\n", False))
        else:
            segments.append((f"<|{role}|>\n{content}\n", False))
    return _merged(segments)


def _merged(segments: Segments) -> Segments:
    """Drop empty segments and join neighbours with the same flag."""
    out: Segments = []
    for text, response in segments:
        if not text:
            continue
        if out and out[-1][1] == response:
            out[-1] = (out[-1][0] + text, response)
        else:
            out.append((text, response))
    return out


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; BOS 256, EOS 257, PAD 258; 320 embedding rows."""

    name = "bytes"
    vocab_size = VOCAB_SIZE
    bos_id: int | None = BOS
    eos_id: int | None = EOS
    pad_id = PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def render_chat(self, messages: list[dict]) -> Segments:
        return builtin_chat(messages, BYTE_END)


class HFTokenizer:
    """A ``transformers`` tokenizer (``.hf``) behind the ``Tokenizer`` protocol."""

    def __init__(self, hf_tokenizer: Any):
        self.hf = hf_tokenizer
        self.name = type(hf_tokenizer).__name__
        self.bos_id: int | None = hf_tokenizer.bos_token_id
        self.eos_id: int | None = hf_tokenizer.eos_token_id
        pad = hf_tokenizer.pad_token_id
        self.pad_id: int = (
            pad if pad is not None else (self.eos_id if self.eos_id is not None else 0)
        )
        specials = [i for i in (self.bos_id, self.eos_id, self.pad_id) if i is not None]
        vocab = hf_tokenizer.get_vocab()
        self.vocab_size: int = max(
            len(hf_tokenizer),
            int(getattr(hf_tokenizer, "vocab_size", 0) or 0),
            max(vocab.values(), default=-1) + 1,
            max(specials, default=-1) + 1,
        )
        eos_text = hf_tokenizer.eos_token
        self.end_text: str = eos_text if isinstance(eos_text, str) and eos_text else BYTE_END

    @property
    def chat_template(self) -> str | None:
        return getattr(self.hf, "chat_template", None) or None

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_segments(self, segments: Segments) -> tuple[list[int], list[bool]]:
        """Tokenize the joined text once (so merges across segment boundaries are what the
        model sees at inference); a token is a response token if any of its characters is.
        Tokenizers without offsets encode segment by segment."""
        text = "".join(t for t, _ in segments)
        if not getattr(self.hf, "is_fast", False):
            return _segmentwise(self, segments)
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        flags = bytearray(len(text))
        pos = 0
        for seg, response in segments:
            if response:
                flags[pos : pos + len(seg)] = b"\x01" * len(seg)
            pos += len(seg)
        mask = [bool(end > start and any(flags[start:end])) for start, end in offsets]
        return ids, mask

    def render_chat(self, messages: list[dict]) -> Segments:
        if self.chat_template is None:
            return builtin_chat(messages, self.end_text)
        return _template_segments(self, messages)

    def _render(self, messages: Sequence[dict], *, generation_prompt: bool = False) -> str:
        return self.hf.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt
        )


def _segmentwise(tokenizer: Tokenizer, segments: Segments) -> tuple[list[int], list[bool]]:
    ids: list[int] = []
    mask: list[bool] = []
    for text, response in segments:
        piece = tokenizer.encode(text)
        ids.extend(piece)
        mask.extend([response] * len(piece))
    return ids, mask


def encode_segments(tokenizer: Tokenizer, segments: Segments) -> tuple[list[int], list[bool]]:
    """Ids for the joined segments and, per id, whether it belongs to a response."""
    method = getattr(tokenizer, "encode_segments", None)
    if method is not None:
        return method(segments)
    return _segmentwise(tokenizer, segments)


def _template_segments(tok: HFTokenizer, messages: list[dict]) -> Segments:
    try:
        full = tok._render(messages)
    except Exception as exc:  # a Jinja template can raise anything (raise_exception, ...)
        raise StrategyError.single(
            "data.format", f"the tokenizer's chat template refused a conversation: {exc}"
        ) from None
    segments: Segments = []
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = _assistant_span(tok, messages, i, full, cursor)
        segments.append((full[cursor:start], False))
        segments.append((full[start:end], True))
        cursor = end
    segments.append((full[cursor:], False))
    return _merged(segments)


def _safe_render(tok: HFTokenizer, messages: Sequence[dict], *, generation_prompt: bool):
    try:
        return tok._render(messages, generation_prompt=generation_prompt)
    except Exception:  # e.g. a template that refuses a conversation ending in a user turn
        return None


def _assistant_span(
    tok: HFTokenizer, messages: list[dict], i: int, full: str, cursor: int
) -> tuple[int, int]:
    through = _safe_render(tok, messages[: i + 1], generation_prompt=False)
    if through is not None and full.startswith(through):
        for generation_prompt in (True, False):
            before = (
                _safe_render(tok, messages[:i], generation_prompt=generation_prompt) if i else ""
            )
            if before is not None and through.startswith(before) and cursor <= len(before):
                if len(through) > len(before):
                    return len(before), len(through)
    content = messages[i]["content"]
    start = full.find(content, cursor)
    if start < 0 or not content:
        raise StrategyError.single(
            "data.format",
            f"the tokenizer's chat template does not write assistant turn {i + 1} verbatim, "
            "so its response tokens cannot be found",
        )
    return start, start + len(content)


def load_tokenizer(path: str) -> HFTokenizer:
    """The tokenizer saved in a local checkpoint directory (never downloaded)."""
    root = Path(path)
    if not root.is_dir() or not any((root / name).is_file() for name in TOKENIZER_FILES):
        raise StrategyError.single(
            "model.path",
            f"{path!r} has no tokenizer (tokenizer.json / tokenizer_config.json); save the "
            "checkpoint's tokenizer next to it (tokenizer.save_pretrained)",
        )
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(root), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StrategyError.single(
            "model.path", f"the tokenizer in {path!r} could not be loaded: {exc}"
        ) from None
    return HFTokenizer(hf)
