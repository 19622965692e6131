"""A probe's one untelemetered warm-up step, once per worker process: a cancel asked before the step
stops it, and leaves the process cold for the next probe to warm (not marked warm with no step)."""

import gpu_runtime
from workers import sweeps

STRATEGY = """\
model: {preset: tiny, seq_len: 16}
data: {source: synthetic}
train: {steps: 5, global_batch: 2, seed: 1}
"""


def test_a_cancelled_warm_up_leaves_the_process_cold_and_the_next_one_warms_it(monkeypatch):
    monkeypatch.setattr(sweeps, "_process_warm", False)
    config = gpu_runtime.load_strategy(STRATEGY)
    sweeps._warm_process(config, "cpu", lambda: True)
    assert sweeps._process_warm is False
    sweeps._warm_process(config, "cpu", lambda: False)
    assert sweeps._process_warm is True
