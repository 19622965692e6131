"""`costlab submit --wait` says where a queued run stands, and a line only when it changes."""

from __future__ import annotations

from costlab_cli.submit import progress, wait_for

QUEUED = {
    "id": 17,
    "status": "queued",
    "priority": "ci",
    "steps": 0,
    "queue_position": {"position": 3, "eta_s": 125.0, "eta_estimated": True},
}


class Replay:
    """The run as the API answers it, poll after poll."""

    def __init__(self, *answers: dict):
        self.answers = list(answers)

    def get(self, path: str, **params) -> dict:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_queued_run_says_its_position_and_estimated_start():
    assert progress(QUEUED) == "run 17: queued, position 3 (ci), starts in about 2 min (estimate)"
    unknown = {**QUEUED, "queue_position": {"position": 1, "eta_s": None}}
    assert progress(unknown).endswith("position 1 (ci), no recent run to estimate a start from")
    assert progress({**QUEUED, "status": "running", "steps": 40}) == "run 17: running, 40 steps"


def test_wait_prints_a_line_only_when_something_changes(capsys):
    done = {
        **QUEUED,
        "status": "succeeded",
        "steps": 20,
        "tokens": 1280,
        "cost_usd": "0.001",
        "arm": {"name": "control"},
        "queue_position": None,
    }
    moved = {**QUEUED, "queue_position": {"position": 1, "eta_s": 30.0}}
    api = Replay(QUEUED, QUEUED, QUEUED, moved, moved, done)
    assert wait_for(api, 17, poll_s=0, timeout_s=60) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "run 17: queued, position 3 (ci), starts in about 2 min (estimate)",
        "run 17: queued, position 1 (ci), starts in about 30 s (estimate)",
    ]
