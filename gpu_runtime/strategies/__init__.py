"""Training strategies switched on by the strategy YAML; each one standalone and tested.

The trainer wires them in; see each module's docstring for the contract it expects.
"""

from gpu_runtime.strategies.batch_scaler import (
    AccumulationPlan,
    BatchScaler,
    GradientNormTracker,
    MicroBatchFloorError,
    plan_accumulation,
    run_step_with_oom_retry,
)
from gpu_runtime.strategies.checkpointing import (
    apply_gradient_checkpointing,
    measure_peak_memory,
    peak_memory_with_and_without,
)
from gpu_runtime.strategies.offload import (
    OffloadError,
    load_tensors,
    offload_embeddings,
    parameters_by_device,
)
from gpu_runtime.strategies.quantization import QuantizationError, quantize_for_lora

__all__ = [
    "AccumulationPlan",
    "BatchScaler",
    "GradientNormTracker",
    "MicroBatchFloorError",
    "OffloadError",
    "QuantizationError",
    "apply_gradient_checkpointing",
    "load_tensors",
    "measure_peak_memory",
    "offload_embeddings",
    "parameters_by_device",
    "peak_memory_with_and_without",
    "plan_accumulation",
    "quantize_for_lora",
    "run_step_with_oom_retry",
]
