"""The search space: ranges, unknown keys, empty and inverted ranges, candidates."""

import pytest

from apps.sweeps.space import (
    SpaceError,
    params_key,
    space_expand,
    space_points,
    space_size,
    strategy_with,
)


def test_lists_and_ranges_expand():
    expanded = space_expand(
        {
            "train.global_batch": {"low": 2, "high": 16, "log2": True},
            "model.seq_len": {"low": 32, "high": 96, "step": 32},
            "precision.compute_dtype": ["fp32", "bf16", "fp32"],
        }
    )
    assert expanded == {
        "train.global_batch": [2, 4, 8, 16],
        "model.seq_len": [32, 64, 96],
        "precision.compute_dtype": ["fp32", "bf16"],
    }
    assert space_size(expanded) == 24 == len(list(space_points(expanded)))


@pytest.mark.parametrize(
    ("space", "key"),
    [
        ({}, "space"),
        ({"train.nope": [1]}, "space.train.nope"),
        ({"train.global_batch": []}, "space.train.global_batch"),
        ({"train.global_batch": {"low": 8, "high": 2}}, "space.train.global_batch"),
        ({"train.global_batch": {"low": 3, "high": 3, "log2": True}}, "space.train.global_batch"),
        ({"train.global_batch": ["8"]}, "space.train.global_batch"),
        ({"kernels.compile": [1]}, "space.kernels.compile"),
        ({"model.seq_len": {"low": 0, "high": 4}}, "space.model.seq_len.low"),
    ],
)
def test_bad_spaces_name_the_key(space, key):
    with pytest.raises(SpaceError) as err:
        space_expand(space)
    assert err.value.key == key


def test_candidate_strategy_sets_nested_keys_and_leaves_the_base_alone():
    base = {"model": {"preset": "tiny"}, "train": {"steps": 5}}
    doc = strategy_with(
        base,
        {
            "memory.gradient_checkpointing.enabled": True,
            "train.global_batch": 4,
            "resources.threads": 2,
        },
    )
    assert doc == {
        "model": {"preset": "tiny"},
        "train": {"steps": 5, "global_batch": 4},
        "memory": {"gradient_checkpointing": {"enabled": True}},
    }
    assert base == {"model": {"preset": "tiny"}, "train": {"steps": 5}}
    assert (
        params_key({"a": 1, "b": 2}) == params_key({"b": 2, "a": 1}) != params_key({"a": 1, "b": 3})
    )
