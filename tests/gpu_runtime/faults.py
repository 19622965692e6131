"""Faults the tests inject into gpu_runtime (production code never imports this module)."""

from __future__ import annotations

import torch


class SimulatedOom:
    """Raises torch.OutOfMemoryError for micro-batches above `fits_up_to` (Trainer.fault)."""

    def __init__(self, fits_up_to: int):
        self.fits_up_to = fits_up_to
        self.raised = 0

    def check(self, micro_batch: int) -> None:
        if micro_batch > self.fits_up_to:
            self.raised += 1
            raise torch.OutOfMemoryError(
                f"simulated out of memory: micro-batch {micro_batch} > {self.fits_up_to} "
                "(test hook)"
            )
