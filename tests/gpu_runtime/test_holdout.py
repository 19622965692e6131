"""The holdout split (``eval.holdout``): by a hash of each record, the same on every run and in
any order, disjoint from what trains, and refused by key where a side would be empty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_runtime.data import load_split_corpus
from gpu_runtime.errors import StrategyError
from gpu_runtime.holdout import synthetic_split_problem
from gpu_runtime.schema import DataSection


def _records(n: int) -> list[dict[str, str]]:
    # each record names itself, so its tokens say which record they are
    return [
        {"instruction": f"Echo the tag <r{i}>.", "output": f"Tag <r{i}> echoed."} for i in range(n)
    ]


def _write(path: Path, records: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _tags(corpus) -> set[str]:
    """The record tags a corpus holds, read back from its token stream (byte tokens)."""
    ids = corpus.tokens.long()
    text = bytes(int(t) for t in (~ids).where(ids < 0, ids) if int(t) < 256).decode()
    return {part.split(">")[0] for part in text.split("<r")[1:]}


def _alpaca(path: str, **keys) -> DataSection:
    return DataSection(source="jsonl", path=path, **keys)


def test_the_split_is_disjoint_covers_every_record_and_nests_as_the_fraction_grows(tmp_path):
    path = _write(tmp_path / "a.jsonl", _records(200))
    split = load_split_corpus(_alpaca(path, loss_on="response"), 0.25, seed=0)
    trained, held = _tags(split.train), _tags(split.held_out)
    # no held-out record is trained on: checked by each record's own tag in the token streams
    assert trained.isdisjoint(held) and len(trained | held) == 200
    assert 20 <= len(held) <= 80  # about a quarter of 200
    assert split.report == {
        "holdout": 0.25,
        "records_held_out": len(held),
        "records_trained": len(trained),
    }
    assert split.train.records.numel() - 1 == len(trained)
    bigger = _tags(load_split_corpus(_alpaca(path), 0.5, seed=0).held_out)
    assert held < bigger  # a record's place is its hash alone: a larger fraction adds records


def test_the_split_is_the_same_on_every_run_and_in_any_record_order(tmp_path):
    records = _records(120)
    first = load_split_corpus(_alpaca(_write(tmp_path / "a" / "x.jsonl", records)), 0.3, seed=0)
    again = load_split_corpus(_alpaca(_write(tmp_path / "a" / "x.jsonl", records)), 0.3, seed=7)
    reordered = load_split_corpus(
        _alpaca(_write(tmp_path / "b" / "x.jsonl", records[::-1])), 0.3, seed=0
    )
    for other in (again, reordered):
        assert _tags(other.held_out) == _tags(first.held_out)
        assert _tags(other.train) == _tags(first.train)
        # the held-out records are in hash order: the very same tokens, whatever the file order
        assert other.held_out.sha256 == first.held_out.sha256
    assert reordered.train.sha256 != first.train.sha256  # training keeps the file's order


def test_copies_of_a_record_land_on_the_same_side(tmp_path):
    records = _records(40)
    path = _write(tmp_path / "a.jsonl", records + records[::2])  # 20 records twice
    split = load_split_corpus(_alpaca(path), 0.5, seed=0)
    assert _tags(split.train).isdisjoint(_tags(split.held_out))
    assert split.report["records_held_out"] + split.report["records_trained"] == 60


def test_a_held_out_file_is_never_trained_on_even_where_data_path_repeats_it(tmp_path):
    records = _records(30)
    data = _write(tmp_path / "train.jsonl", records)
    held = _write(tmp_path / "held" / "h.jsonl", records[:5] + _records(40)[30:])
    split = load_split_corpus(_alpaca(data), held, seed=0)
    assert _tags(split.held_out) == {str(i) for i in [*range(5), *range(30, 40)]}
    assert _tags(split.train) == {str(i) for i in range(5, 30)}
    assert split.report["duplicates_left_out"] == 5 and split.report["records_held_out"] == 15


@pytest.mark.parametrize(
    ("holdout", "records", "reason"),
    [
        (0.001, 3, "nothing to evaluate"),
        (0.999, 3, "nothing left to train"),
        ("missing-*.jsonl", 3, "no files match"),
        ("SAME", 3, "nothing left to train"),
    ],
)
def test_a_split_that_leaves_a_side_empty_is_refused_naming_eval_holdout(
    tmp_path, holdout, records, reason
):
    data = _write(tmp_path / "train.jsonl", _records(records))
    if holdout == "SAME":
        holdout = data
    elif isinstance(holdout, str):
        holdout = str(tmp_path / holdout)
    with pytest.raises(StrategyError) as info:
        load_split_corpus(_alpaca(data), holdout, seed=0)
    assert info.value.errors[0]["key"] == "eval.holdout"
    assert reason in info.value.errors[0]["message"], info.value.errors


def test_a_text_corpus_holds_out_whole_files_and_one_file_cannot_be_split(tmp_path):
    (tmp_path / "one.txt").write_text("a single file of text " * 20)
    with pytest.raises(StrategyError) as info:
        load_split_corpus(DataSection(source="text", path=str(tmp_path / "*.txt")), 0.5, seed=0)
    assert info.value.errors[0]["key"] == "eval.holdout"
    assert "1 file" in info.value.errors[0]["message"]
    assert "held-out file" in info.value.errors[0]["message"]


def test_the_schema_checks_a_synthetic_split_as_the_runtime_makes_it():
    assert synthetic_split_problem(0, 1e-9) is not None and synthetic_split_problem(0, 0.1) is None
    for fraction in (1e-9, 0.004, 0.02, 0.1, 0.5, 0.9999999):
        problem = synthetic_split_problem(0, fraction)
        try:
            split = load_split_corpus(DataSection(), fraction, seed=0)
        except StrategyError as exc:
            assert problem is not None and exc.errors[0]["message"] == problem
        else:
            assert problem is None
            assert split.report["records_held_out"] + split.report["records_trained"] == 128
