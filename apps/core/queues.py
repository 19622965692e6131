"""Queue names, in one place."""

from enum import StrEnum


class CeleryQueue(StrEnum):
    DEFAULT = "default"
    CPU = "cpu"
    GPU = "gpu"
