"""The freeze rule, written once: when an arm is frozen for its cost. Pure: no ORM, no clock.

An active arm is frozen when the arm and the control each meet the experiment's evidence minimums
(runs, samples, and the runs before the asymptotic bound is consulted), its deviation from the
control lies beyond the threshold, and so does the always-valid lower bound of that deviation.

`freeze_blocks` says which of these conditions an arm does not meet, as data. Both readers of the
rule are generated from it: apps.attribution.decide.decisions acts on it (and records each block
in the snapshot's `blocked_by`), apps.attribution.decide.verdict says it (a `costlier` verdict
exactly when the rule could act; `freeze_holds`: why a deviation beyond the threshold froze
nothing).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shortfall:
    """One minimum not met: `side` (arm or control) has `has` of the `needs` `what` (runs or
    samples) that the experiment's `field` asks for."""

    side: str
    what: str
    has: int
    needs: int
    field: str


@dataclass(frozen=True)
class Minimums:
    """The evidence a freeze waits for, in the arm and in the control alike: the experiment's."""

    runs: int  # min_runs_per_arm
    samples: int  # min_samples_per_arm
    cs_runs: int  # min_cs_runs_per_arm: runs before the (asymptotic) bound is consulted

    @classmethod
    def of(cls, experiment) -> Minimums:
        return cls(
            runs=experiment.min_runs_per_arm,
            samples=experiment.min_samples_per_arm,
            cs_runs=experiment.min_cs_runs_per_arm,
        )

    @property
    def runs_needed(self) -> int:
        """Runs per arm before anything can be decided: both run minimums."""
        return max(self.runs, self.cs_runs)

    def shortfalls(self, side: str, *, runs: int, samples: int) -> list[Shortfall]:
        """The minimums that one side, with these runs and samples, does not meet yet."""
        out = []
        if runs < self.runs:
            out.append(Shortfall(side, "runs", runs, self.runs, "min_runs_per_arm"))
        if samples < self.samples:
            out.append(Shortfall(side, "samples", samples, self.samples, "min_samples_per_arm"))
        if runs < self.cs_runs:
            out.append(Shortfall(side, "runs", runs, self.cs_runs, "min_cs_runs_per_arm"))
        return out


def evidence_shortfalls(
    *, arm_runs: int, arm_samples: int, control_runs: int, control_samples: int, minimums: Minimums
) -> list[Shortfall]:
    """The minimums that the arm or the control does not meet yet (empty: the evidence is there)."""
    return minimums.shortfalls("arm", runs=arm_runs, samples=arm_samples) + minimums.shortfalls(
        "control", runs=control_runs, samples=control_samples
    )


def bound_clears(low: float | None, threshold: float) -> bool:
    """Whether the always-valid lower bound of the deviation lies beyond the threshold."""
    return low is not None and low > threshold


STATE = "state"  # the arm is frozen already
EVIDENCE = "evidence"  # a minimum not met (`shortfall`)
DEVIATION = "deviation"  # the estimate (`value`; None: not estimable) is not beyond the threshold
BOUND = "bound"  # the lower bound (`value`; None: no bound yet) does not clear the threshold


@dataclass(frozen=True)
class Block:
    """One condition of the freeze rule that an arm does not meet."""

    kind: str  # STATE | EVIDENCE | DEVIATION | BOUND
    threshold: float
    value: float | None = None
    shortfall: Shortfall | None = None


def freeze_blocks(
    *,
    active: bool,
    arm_runs: int,
    arm_samples: int,
    control_runs: int,
    control_samples: int,
    estimate: float | None,
    low: float | None,
    threshold: float,
    minimums: Minimums,
) -> list[Block]:
    """What stands between an arm and a freeze for its cost, in the rule's order (empty: freeze).

    `estimate` and `low`: the deviation from the control, (arm - control) / control on the
    compared metric, and its always-valid lower bound."""
    blocks = [] if active else [Block(STATE, threshold)]
    blocks += [
        Block(EVIDENCE, threshold, shortfall=s)
        for s in evidence_shortfalls(
            arm_runs=arm_runs,
            arm_samples=arm_samples,
            control_runs=control_runs,
            control_samples=control_samples,
            minimums=minimums,
        )
    ]
    if estimate is None or estimate <= threshold:
        blocks.append(Block(DEVIATION, threshold, estimate))
    elif not bound_clears(low, threshold):
        blocks.append(Block(BOUND, threshold, low))
    return blocks
