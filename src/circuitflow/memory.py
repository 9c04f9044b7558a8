"""Memory planning: estimate a forward pass's peak memory, pick a batch size, back off on OOM.

Stages that run the model over many inputs (capture, and any later stage that batches) call
`plan_batch_size` before starting and wrap each batch in `OOMBackoff`, so the batch size is
chosen from what the device has rather than hoped for, and a CUDA out-of-memory error halves it
instead of killing a job hours in.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)
MiB = 1 << 20


def available_bytes(device: str) -> int:
    """Memory a new allocation can use now: free GPU memory on CUDA; on CPU the host's available
    RAM (psutil if installed, else /proc/meminfo), capped by a cgroup limit (Slurm, containers)."""
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    avail = _host_available()
    limit = _cgroup_headroom()
    return min(avail, limit) if limit is not None else avail


def _host_available() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30  # unknown platform: assume a modest 4 GiB


def _cgroup_headroom() -> int | None:
    """Limit minus usage of this process's cgroup (v2), or None when unlimited or unknown."""
    base = Path("/sys/fs/cgroup")
    try:
        raw = (base / "memory.max").read_text().strip()
        if raw == "max":
            return None
        return max(0, int(raw) - int((base / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def current_memory_bytes(device: str) -> int:
    """Memory this process holds now: CUDA's allocated bytes, else the resident set."""
    if device.startswith("cuda"):
        return int(torch.cuda.memory_allocated())
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_memory_bytes(device)


def peak_memory_bytes(device: str) -> int:
    """Peak memory of this run: CUDA's max allocated, else the process's max resident set."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def dtype_bytes(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class ForwardEstimate:
    """Peak memory of a batched forward pass as `fixed + per_context * batch_size` bytes."""

    weights: int  # model parameters (on the compute device)
    per_context_device: int  # working activations of one context on the compute device
    per_context_host: int  # captured activations of one context held on the host
    buffers: int  # fixed host buffers (write caches, token arrays)
    device: str

    def fixed(self) -> int:
        return self.weights + self.buffers

    def per_context(self) -> int:
        """Bytes one more context costs where the limit applies (host and device are the same
        memory on CPU)."""
        if self.device.startswith("cuda"):
            return self.per_context_device
        return self.per_context_device + self.per_context_host

    def total(self, batch_size: int) -> int:
        return self.fixed() + self.per_context() * batch_size


def estimate_forward(
    model_cfg,
    n_params: int,
    context_length: int,
    stop_at_layer: int | None,
    n_captured: int,
    compute_dtype: torch.dtype,
    storage_dtype: torch.dtype | str,
    device: str,
    buffers: int = 0,
) -> ForwardEstimate:
    """Estimate from a HookedTransformerConfig-like object (n_layers, d_model, n_heads, d_mlp).

    A no-grad forward keeps a handful of tensors alive at once: the residual stream and its
    normalised copy, q/k/v and the attention scores and pattern of one layer, the MLP hidden
    layer, plus every captured hook's output (which must live until it is copied out). Layers
    past `stop_at_layer` and the unembedding (the logits, often the largest tensor) are not run.
    """
    c = dtype_bytes(compute_dtype)
    t = context_length
    d, h, m = model_cfg.d_model, model_cfg.n_heads, model_cfg.d_mlp or 4 * model_cfg.d_model
    d_head = getattr(model_cfg, "d_head", d // h)
    resid = 4 * t * d  # residual, LN output, attention output, block output
    attn = 3 * t * h * d_head + 2 * h * t * t  # q, k, v; scores and pattern
    mlp = 2 * t * m  # pre- and post-activation
    per_device = (resid + attn + mlp + n_captured * t * d) * c
    if stop_at_layer is None:
        per_device += t * model_cfg.d_vocab * max(c, 4)  # logits (fp32 upcast in the loss)
    per_host = n_captured * t * d * (dtype_bytes(storage_dtype) + 4)  # copy + staging
    return ForwardEstimate(
        weights=n_params * c,
        per_context_device=int(per_device * 1.2),  # allocator fragmentation and temporaries
        per_context_host=per_host,
        buffers=buffers,
        device=device,
    )


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    estimate_bytes: int
    available_bytes: int
    budget_bytes: int

    def describe(self) -> str:
        return (
            f"memory plan: batch {self.batch_size} contexts, estimated peak "
            f"{self.estimate_bytes / MiB:.0f} MiB of a {self.budget_bytes / MiB:.0f} MiB budget "
            f"({self.available_bytes / MiB:.0f} MiB available)"
        )


def plan_batch_size(
    estimate: ForwardEstimate,
    max_batch_size: int,
    fraction: float = 0.8,
    available: int | None = None,
) -> BatchPlan:
    """The largest power-of-two batch size (at most `max_batch_size`) whose estimated peak fits
    in `fraction` of the available memory; raises MemoryError when not even one context fits."""
    available = available_bytes(estimate.device) if available is None else available
    budget = int(available * fraction)
    room = budget - estimate.fixed()
    if room < estimate.per_context():
        raise MemoryError(
            f"not enough memory on {estimate.device}: the model needs about "
            f"{estimate.total(1) / MiB:.0f} MiB for one context, {budget / MiB:.0f} MiB is "
            "available; use a larger machine, a smaller dtype or a shorter context"
        )
    batch = 1
    while batch * 2 <= max_batch_size and estimate.total(batch * 2) <= budget:
        batch *= 2
    return BatchPlan(batch, estimate.total(batch), available, budget)


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError)


def free_device_memory(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


class OOMBackoff:
    """Run batches, halving the batch size on CUDA out-of-memory and keeping the smaller size.

    `run(fn, n_items)` calls `fn(batch_size)` until it succeeds; each OOM frees the cache and
    halves the size. Below 1 it raises MemoryError with a clear message. `inject` is a test
    hook: called with the batch size before each try, it may raise OutOfMemoryError itself.
    """

    def __init__(
        self,
        batch_size: int,
        device: str,
        inject: Callable[[int], None] | None = None,
        on_change: Callable[[int], None] | None = None,
    ):
        self.batch_size = batch_size
        self.device = device
        self.inject = inject
        self.on_change = on_change

    def run(self, fn: Callable[[int], object]):
        while True:
            try:
                if self.inject is not None:
                    self.inject(self.batch_size)
                return fn(self.batch_size)
            except torch.cuda.OutOfMemoryError:
                free_device_memory(self.device)
                if self.batch_size <= 1:
                    raise MemoryError(
                        f"out of memory on {self.device} even at batch size 1; "
                        "use a larger device, a smaller dtype or a shorter context"
                    ) from None
                self.batch_size //= 2
                log.warning("out of memory: batch size halved to %d", self.batch_size)
                if self.on_change is not None:
                    self.on_change(self.batch_size)
