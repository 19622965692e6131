"""Attribution's reads for the interfaces: what the API, the dashboard (and through the API, the
CLI) take from attribution to say a verdict and a report.

Other apps reach attribution through this module, its models and its writes (`services`,
`alerts`); the machinery behind them (the freeze rule, the statistics, the tick's steps) is private
to the app (an import-linter contract in pyproject.toml says so).
"""

from apps.attribution.decide.freeze_rule import Minimums
from apps.attribution.decide.quality import QUALITY_VERDICTS
from apps.attribution.decide.verdict import VERDICTS, Said, arms_verdicts
from apps.attribution.say.report import ExperimentReport, experiment_report
from apps.attribution.say.snapshots import window_without
from apps.attribution.selectors import quality_curves, snapshot_series

__all__ = [
    # the verdict per arm (one rule for the API, the CLI's gate, the dashboard and the freeze)
    "VERDICTS",
    "Minimums",
    "Said",
    "arms_verdicts",
    # the quality verdict's names
    "QUALITY_VERDICTS",
    # the per-arm report
    "ExperimentReport",
    "experiment_report",
    # the dashboard's charts and card: snapshots over time, quality curves, a window recomputed
    # without outlier runs
    "quality_curves",
    "snapshot_series",
    "window_without",
]
