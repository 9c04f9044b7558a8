"""Memory: what every stage shares to plan its batches, survive out-of-memory errors and
report its peak, by concern:

- `probes`: what a device has free, what this process holds and its peak (`PeakMeter`);
- `planning`: `Estimate` (a stage's peak as a function of its batch size), `plan_batch_size`,
  and `estimate_forward`, a model's no-grad forward pass;
- `backoff`: `OOMBackoff`, which halves a batch on CUDA out-of-memory, and the fault injection
  the tests use (CIRCUITFLOW_INJECT_OOM);
- `runtime`: a job's process before its work (its imports, the CUDA runtime, model loading).

Each stage's own estimate lives beside its code (`capture/plan.py`, `sae/plan.py`,
`attribution/plan.py`, `interventions/plan.py`, `model/plan.py`, `baseline_plan.py`), and the rule
table (`circuitflow.resources`) turns them into each job's Slurm memory. Nothing here imports a
stage. The names below are the ones stages use.
"""

import importlib

# Each name's submodule, imported on first use (PEP 562): planning (every Snakemake invocation
# plans each job) reads `planning` and `runtime` only, and must not import torch, which
# `backoff` and the stages' probes of a GPU need.
_HOMES = {
    "INJECT_OOM_ENV": "backoff",
    "OOMBackoff": "backoff",
    "free_device_memory": "backoff",
    "injected_oom": "backoff",
    "PLANNED_PROMPT_LENGTH": "planning",
    "BatchPlan": "planning",
    "Estimate": "planning",
    "capture_hooks": "planning",
    "DTYPE_BYTES": "planning",
    "dtype_bytes": "planning",
    "estimate_forward": "planning",
    "model_dtype": "planning",
    "model_dtype_name": "planning",
    "n_dictionaries": "planning",
    "n_hooks": "planning",
    "n_prompts": "planning",
    "n_transcoders": "planning",
    "plan_batch_size": "planning",
    "prompt_length": "planning",
    "FAST_THRESHOLD": "probes",
    "LIVE_THRESHOLD": "probes",
    "MiB": "probes",
    "PeakMeter": "probes",
    "available_bytes": "probes",
    "current_memory_bytes": "probes",
    "peak_memory_bytes": "probes",
    "resident_peak_bytes": "probes",
    "set_mmap_threshold": "probes",
    "track_live_bytes_on_cpu": "probes",
    "CUDA_HOST_MB": "runtime",
    "RUNTIME_MB": "runtime",
    "RUNTIME_MODULES": "runtime",
    "load_bytes": "runtime",
    "measure_runtime_bytes": "runtime",
    "runtime_bytes": "runtime",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_HOMES)  # every name is one of a submodule's, re-exported lazily
