"""Queue names, in one place."""

from enum import StrEnum


class CeleryQueue(StrEnum):
    DEFAULT = "default"  # attribution tick, sweeper, housekeeping
    CPU = "cpu"
    GPU = "gpu"
    ALERTS = "alerts"  # webhook/mail deliveries: a slow receiver never holds up the tick
