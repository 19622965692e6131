"""One trained token everywhere: the SDK's count of a padded batch equals gpu_runtime's count of the
same rows (a target whose loss trains: no padding, no -100 label, no first token of a row), in
each shape a batch comes in. The issue's 10 padded steps counted 2,008 (attention mask), 2,688
(the Trainer's flag on: padding too) and 2,008 (non_padding), against the runtime's targets."""

from __future__ import annotations

import torch

from costlab.tokens import IGNORE_INDEX, trained_tokens
from gpu_runtime.data import split_batch
from gpu_runtime.data import trained_tokens as runtime_trained

ROWS, WIDTH = 4, 17  # gpu_runtime's rows: seq_len + 1 ids


def padded_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ids with right padding of different lengths, and their attention mask."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (ROWS, WIDTH), generator=g)
    mask = torch.ones(ROWS, WIDTH, dtype=torch.long)
    for row, real in enumerate((17, 12, 9, 5)):
        mask[row, real:] = 0
        ids[row, real:] = 0
    return ids, mask


def test_a_padded_batch_counts_the_same_in_every_shape_and_in_the_runtime():
    ids, mask = padded_rows()
    marked = torch.where(mask.bool(), ids, ~ids)  # the runtime's encoding: ~id is not a target
    runtime = runtime_trained(marked)
    assert runtime == 16 + 11 + 8 + 4  # each row's real tokens less its first
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)  # what DataCollatorForLanguageModeling makes
    inputs, targets = split_batch(marked)  # a loop that shifts its own targets
    counts = {
        "labels": trained_tokens({"input_ids": ids, "attention_mask": mask, "labels": labels}),
        "shift_labels": trained_tokens({"input_ids": ids, "shift_labels": labels[:, 1:]}),
        "attention_mask": trained_tokens({"input_ids": ids, "attention_mask": mask}),
        "(inputs, targets)": trained_tokens((inputs, targets)),
    }
    assert {k: int(v) for k, v in counts.items()} == dict.fromkeys(counts, runtime)


def test_unpadded_ids_count_every_position_but_the_first_of_each_row():
    ids = torch.randint(0, 100, (ROWS, WIDTH))
    assert trained_tokens(ids) == trained_tokens({"input_ids": ids}) == ROWS * (WIDTH - 1)
    # a model that does not shift (masked LM, sequence-to-sequence): its labels are its targets
    labels = ids.clone()
    labels[:, ::2] = IGNORE_INDEX
    assert int(trained_tokens({"labels": labels}, shifted=False)) == ROWS * (WIDTH // 2)
    assert trained_tokens({"pixel_values": torch.zeros(2, 3)}) is None
    assert trained_tokens(torch.zeros(2, 3)) is None  # floats are not ids
