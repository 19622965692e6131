"""One trained token everywhere: a position whose loss trains the model.

costlab prices training per token, so a token must mean the same thing in every integration (the
runtime, ``run.log``, the Trainer and Lightning callbacks, ``costlab upload``): a *target* the
loss is computed on. Padding is not one, a label of -100 is not one, and in a causal language
model the first token of a row is not one (nothing predicts it: the loss compares position t's
logits with token t + 1). A row of 128 ids with no padding trains 127 targets; gpu_runtime's rows
carry seq_len + 1 ids and train seq_len.

    run.log(tokens=costlab.trained_tokens(batch), loss=loss)

What a batch is counted from, first match wins (the count is a 0-d tensor where the batch holds
tensors: no host sync here, it is read later on the sampler thread):

- ``shift_labels``: the labels already shifted (padding-free collators): those not -100;
- ``labels``: those not -100, after the causal shift (``labels[..., 1:]``) unless
  ``shifted=False`` (a masked or sequence-to-sequence model: its labels are its targets);
- ``attention_mask``: the real tokens that have a real token before them (``mask[..., 1:]``
  where the row is shifted, else the whole mask);
- ``input_ids`` (or an integer tensor): its positions, less the first of each row;
- a tuple or list ``(inputs, targets)`` of two integer tensors of one shape (a loop that shifts
  its own targets, Lightning's examples): the targets not -100; otherwise its first element.

None: nothing to count (the caller's own count is needed: ``tokens=fn``)."""

from __future__ import annotations

from typing import Any

IGNORE_INDEX = -100  # PyTorch's cross_entropy default and the Trainer's padding label


def _get(batch: Any, key: str) -> Any:
    try:
        return batch.get(key)
    except (AttributeError, TypeError):
        return None


def _is_ids(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return (
        dtype is not None
        and hasattr(value, "numel")
        and not getattr(dtype, "is_floating_point", True)
        and not getattr(dtype, "is_complex", False)
    )


def _rows_less_first(ids: Any) -> Any:
    if getattr(ids, "dim", lambda: 0)() == 0:
        return ids.numel()
    return ids[..., 1:].numel()


def trained_tokens(batch: Any, *, shifted: bool = True) -> Any:
    """The targets a batch trains (see the module): a 0-d tensor or an int; None when the batch
    holds nothing to count. shifted: the model predicts the next token (a causal LM)."""
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        given = _get(batch, "shift_labels")
        if given is not None:
            return given.ne(IGNORE_INDEX).sum()
        labels = _get(batch, "labels")
        if labels is not None and _is_ids(labels):
            return (labels[..., 1:] if shifted else labels).ne(IGNORE_INDEX).sum()
        mask = _get(batch, "attention_mask")
        if mask is not None:
            return (mask[..., 1:] if shifted else mask).sum()
        ids = _get(batch, "input_ids")
        if ids is None:
            return None
        return _rows_less_first(ids) if shifted else ids.numel()
    if isinstance(batch, list | tuple):
        if not batch:
            return None
        if (
            len(batch) >= 2
            and _is_ids(batch[0])
            and _is_ids(batch[1])
            and tuple(batch[0].shape) == tuple(batch[1].shape)
        ):
            return batch[1].ne(IGNORE_INDEX).sum()  # (inputs, targets): the targets train
        return trained_tokens(batch[0], shifted=shifted)
    if _is_ids(batch):
        return _rows_less_first(batch) if shifted else batch.numel()
    return None
