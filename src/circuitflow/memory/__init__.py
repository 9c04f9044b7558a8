"""Memory: what every stage shares to plan its batches, survive out-of-memory errors and
report its peak, by concern:

- `probes`: what a device has free, what this process holds and its peak (`PeakMeter`);
- `planning`: `Estimate` (a stage's peak as a function of its batch size), `plan_batch_size`,
  and `estimate_forward`, a model's no-grad forward pass;
- `backoff`: `OOMBackoff`, which halves a batch on CUDA out-of-memory, and the fault injection
  the tests use (CIRCUITFLOW_INJECT_OOM);
- `runtime`: a job's process before its work (its imports, the CUDA runtime, model loading).

Each stage's own estimate lives beside its code (`capture/plan.py`, `sae/plan.py`,
`attribution/plan.py`, `interventions/plan.py`, `model/plan.py`, `baseline.py`), and the rule
table (`circuitflow.resources`) turns them into each job's Slurm memory. Nothing here imports a
stage. The names below are the ones stages use.
"""

from circuitflow.memory.backoff import (
    INJECT_OOM_ENV,
    OOMBackoff,
    free_device_memory,
    injected_oom,
)
from circuitflow.memory.planning import (
    PLANNED_PROMPT_LENGTH,
    BatchPlan,
    Estimate,
    capture_hooks,
    dtype_bytes,
    estimate_forward,
    model_dtype,
    n_dictionaries,
    n_hooks,
    n_prompts,
    n_transcoders,
    plan_batch_size,
    prompt_length,
)
from circuitflow.memory.probes import (
    FAST_THRESHOLD,
    LIVE_THRESHOLD,
    MiB,
    PeakMeter,
    available_bytes,
    current_memory_bytes,
    peak_memory_bytes,
    resident_peak_bytes,
    set_mmap_threshold,
    track_live_bytes_on_cpu,
)
from circuitflow.memory.runtime import (
    CUDA_HOST_MB,
    RUNTIME_MB,
    RUNTIME_MODULES,
    load_bytes,
    measure_runtime_bytes,
    runtime_bytes,
)

__all__ = [
    "BatchPlan",
    "CUDA_HOST_MB",
    "Estimate",
    "FAST_THRESHOLD",
    "INJECT_OOM_ENV",
    "LIVE_THRESHOLD",
    "MiB",
    "OOMBackoff",
    "PLANNED_PROMPT_LENGTH",
    "PeakMeter",
    "RUNTIME_MB",
    "RUNTIME_MODULES",
    "available_bytes",
    "current_memory_bytes",
    "dtype_bytes",
    "estimate_forward",
    "free_device_memory",
    "injected_oom",
    "load_bytes",
    "measure_runtime_bytes",
    "model_dtype",
    "capture_hooks",
    "n_dictionaries",
    "n_hooks",
    "n_transcoders",
    "n_prompts",
    "peak_memory_bytes",
    "plan_batch_size",
    "prompt_length",
    "resident_peak_bytes",
    "runtime_bytes",
    "set_mmap_threshold",
    "track_live_bytes_on_cpu",
]
