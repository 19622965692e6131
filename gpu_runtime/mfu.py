"""Model FLOPs utilisation: achieved training FLOP/s over the device's dense peak.

FLOPs per token follow PaLM (appendix B): 6N + 12*L*d*T, N the parameters outside the
embedding table (see ``ModelArgs.flops_per_token``). Peaks are dense (no 2:4 sparsity)
tensor-core figures from the vendors' data sheets.
"""

from __future__ import annotations

# (name fragment, {compute dtype: dense FLOP/s}); the first fragment found in the device name wins.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIE", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
]


def peak_flops(
    device_label: str, compute_dtype: str, configured: float | None = None
) -> float | None:
    """The dense peak for this device and dtype: the configured one, else the table;
    None if unknown."""
    if configured is not None:
        return configured
    name = device_label.upper()
    for fragment, peaks in PEAK_FLOPS:
        if fragment in name:
            return peaks.get(compute_dtype)
    return None


def mfu(tokens_per_s: float | None, flops_per_token: float, peak: float | None) -> float | None:
    """Achieved FLOP/s (tokens/s x FLOPs per token) as a fraction of the peak."""
    if tokens_per_s is None or not peak:
        return None
    return tokens_per_s * flops_per_token / peak
