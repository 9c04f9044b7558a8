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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")
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
    return resident_peak_bytes()


def resident_peak_bytes() -> int:
    """This process's peak resident set: VmHWM, which starts afresh at exec. Not ru_maxrss:
    Linux carries the parent's high-water mark across fork and exec into it, so a job started
    by a 1 GB process (pytest, Snakemake) would report at least 1 GB."""
    hwm = _proc_status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def _proc_status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_rss_high_water() -> bool:
    """Reset this process's resident-set high-water mark (Linux >= 4.0); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
LIVE_THRESHOLD = 64 << 10
FAST_THRESHOLD = 32 << 20  # glibc's own adaptive threshold stops here


def set_mmap_threshold(n_bytes: int) -> bool:
    """glibc: allocations of `n_bytes` or more get their own mapping, returned to the system
    when freed. False where unavailable (not glibc)."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, n_bytes))
    except (OSError, AttributeError):
        return False


def track_live_bytes_on_cpu() -> bool:
    """Make the process's resident set follow live allocations on Linux/glibc: every allocation
    of 64 KiB or more gets its own mapping, returned when freed. Without it glibc keeps freed
    blocks below its (adaptive, up to 32 MiB) threshold, and the resident peak measures the
    allocator's history rather than the work's tensors (CUDA's allocator statistics count live
    tensors). It costs time (a page fault per fresh page): timed runs switch it off
    (`set_mmap_threshold(FAST_THRESHOLD)`). Returns False where unavailable."""
    return set_mmap_threshold(LIVE_THRESHOLD)


class PeakMeter:
    """Peak memory of the work inside a `with` block, on the device it runs on.

    CUDA: the allocator's peak of allocated bytes inside the block (`peak`), and that minus what
    was allocated on entry (`delta`). CPU: the process's resident-set high-water mark (VmHWM,
    reset on entry through /proc/self/clear_refs) and that minus the resident set on entry.
    Where the high-water mark cannot be reset, `exact` is False and the CPU figures are the
    process's lifetime peak (ru_maxrss), an upper bound.
    """

    def __init__(self, device: str):
        self.device = device
        self.base = self.peak = 0
        self.exact = True

    def __enter__(self) -> PeakMeter:
        import gc

        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = int(torch.cuda.memory_allocated())
        else:
            self.exact = _reset_rss_high_water()
            self.base = current_memory_bytes(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = int(torch.cuda.max_memory_allocated())
        else:
            hwm = _proc_status_bytes("VmHWM") if self.exact else None
            self.peak = hwm if hwm is not None else peak_memory_bytes(self.device)

    @property
    def delta(self) -> int:
        """Peak bytes the block added on top of what was held on entry."""
        return max(0, self.peak - self.base)


def dtype_bytes(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Estimate:
    """Peak memory of a stage's batched work as a function of its batch size n (contexts, rows
    or prompts): `fixed + per_item * n` bytes where the limit applies (the GPU on CUDA; host and
    device together on CPU, where they are the same memory), or the peak of a phase that does not
    grow with n (an optimiser step) when that is higher."""

    weights: int  # parameters on the compute device (model, SAEs)
    per_context_device: int  # working bytes of one more item on the compute device
    per_context_host: int  # host bytes of one more item (captured rows awaiting the write)
    buffers: int  # fixed host bytes (write caches, shuffle buffers)
    device: str
    fixed_device: int = 0  # other fixed device bytes: optimiser state, weight copies
    other_phases: tuple[int, ...] = ()  # peaks of phases independent of n, where the limit applies
    item: str = "context"

    def fixed(self) -> int:
        host = 0 if self.device.startswith("cuda") else self.buffers
        return self.weights + self.fixed_device + host

    def per_context(self) -> int:
        """Bytes one more item costs where the limit applies."""
        if self.device.startswith("cuda"):
            return self.per_context_device
        return self.per_context_device + self.per_context_host

    per_item = per_context

    def total(self, batch_size: int) -> int:
        return max(self.fixed() + self.per_context() * batch_size, *self.other_phases, 0)

    def host(self, batch_size: int) -> int:
        """Host bytes at `batch_size` (on CPU part of `total`)."""
        return self.buffers + self.per_context_host * batch_size


ForwardEstimate = Estimate  # the capture stage's name for it


def _model_dims(cfg) -> tuple[int, int, int, int, int, int]:
    d, h = cfg.d_model, cfg.n_heads
    d_head = getattr(cfg, "d_head", None) or d // h
    kv = getattr(cfg, "n_key_value_heads", None) or h
    return d, h, d_head, kv, cfg.d_mlp or 4 * d, cfg.d_vocab


def _mlp_copies(cfg, grad: bool) -> int:
    """MLP-width tensors per token alive at the MLP's peak. TransformerLens computes gelu_new as
    eight eager elementwise ops and a gated MLP as silu(gate) * up, so both hold four d_mlp-wide
    tensors at once without grad, and save four (gelu_new) or three (gated) for backward; a
    single-op activation (gelu, relu, silu, PyTorch's tanh gelu) holds two and saves one."""
    if getattr(cfg, "gated_mlp", False):
        return 3 if grad else 4
    if getattr(cfg, "act_fn", None) in ("gelu", "relu", "silu", "gelu_pytorch_tanh"):
        return 1 if grad else 2
    return 4  # gelu_new, gelu_fast, solu and unknown ones: the eager elementwise chains


def _weight_copy_bytes(cfg, c: int, unembed: bool) -> int:
    """The largest weight TransformerLens copies per call (`.T.contiguous()`: W_O, the gated
    MLP's matrices, W_U): alive next to the activations of the layer that uses it."""
    d, h, dh, _kv, m, v = _model_dims(cfg)
    largest = max(h * dh * d, d * m if getattr(cfg, "gated_mlp", False) else 0)
    return max(largest, d * v if unembed else 0) * c


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
) -> Estimate:
    """Peak memory of a no-grad forward pass (the capture stage) from a HookedTransformerConfig.

    Counted from how TransformerLens computes a block eagerly (checked against measured peaks on
    CPU by tests/test_memory_accuracy.py), in tensors of one context:
    - attention: the residual stream, the three LayerNorm outputs (q, k and v get one each),
      q, k, v (GQA: fewer k/v heads), and the scores' softmax chain (masked scores, pattern,
      its NaN mask and the cleaned pattern: 4.25 [heads, t, t] tensors) or, with rotary
      positions, the rotation's four temporaries of q, whichever is larger;
    - MLP: four residual-width tensors and the activation's d_mlp-wide temporaries;
    plus each captured hook's output awaiting its write (`storage_dtype`, on the host), one
    weight copy (`_weight_copy_bytes`), and the logits when the unembedding runs.
    """
    c = dtype_bytes(compute_dtype)
    t = context_length
    d, h, dh, kv, m, v = _model_dims(model_cfg)
    rotary = getattr(model_cfg, "positional_embedding_type", "") == "rotary"
    q = t * h * dh
    attn = 4 * t * d + q + 2 * t * kv * dh + max(4.25 * h * t * t, 4 * q if rotary else 0)
    mlp = 4 * t * d + _mlp_copies(model_cfg, grad=False) * t * m
    per_device = max(attn, mlp) * c
    if stop_at_layer is None:
        per_device += 2 * t * v * max(c, 4)  # logits and their fp32 copy in the loss
    captured = n_captured * t * d * dtype_bytes(storage_dtype)
    if device.startswith("cuda"):
        per_device += t * d * dtype_bytes(storage_dtype)  # one hook's copy before it moves
    return Estimate(
        weights=n_params * c,
        per_context_device=int(per_device),
        per_context_host=captured,
        buffers=buffers,
        device=device,
        fixed_device=_weight_copy_bytes(model_cfg, c, unembed=stop_at_layer is None),
    )


# SAE training: tensors of width d_sae per training row alive at the step's peak (each
# architecture's `wide_per_row` in circuitflow.sae.architectures), plus d_in-wide ones (input,
# reconstruction, residual, grads).
SAE_NARROW_PER_ROW = 8
# Parameters, gradients and Adam's two moments are 4 copies of the SAE's parameters; Adam's
# step holds temporaries (sqrt and quotient of the second moment) on top: 5.75 copies measured.
SAE_OPTIMISER_COPIES = 5.75
SAE_AUTO_MAX_BATCH = 16384  # sae.batch_size auto: the largest power of two up to this that fits


def sae_param_bytes(d_in: int, d_sae: int, dtype_size: int = 4) -> int:
    return (2 * d_in * d_sae + 2 * d_sae + d_in) * dtype_size


def estimate_sae_training(
    d_in: int,
    d_sae: int,
    architecture: str,
    device: str,
    n_file_rows: int,
    shuffle_buffer_rows: int,
    chunk_rows: int = 4096,
    storage_dtype: torch.dtype | str = "float16",
    resident: int = 0,
    sparse: bool = False,
) -> Estimate:
    """Peak memory of SAE training (the train_sae stage's loop) per training row.

    Device: `resident` bytes (the model, loaded for the spliced evaluation), the SAE's fp32
    parameters, gradients and Adam state (4 copies), and per row `wide_per_row` d_sae-wide
    (`sparse_wide_per_row` for sae.fast's sparse trainer, `sparse`) and SAE_NARROW_PER_ROW
    d_in-wide fp32 tensors; Adam's step (SAE_OPTIMISER_COPIES) is the other
    phase. Host: the stream's shuffle buffer (whole HDF5 chunks, at most the file) as fp32, and
    while a buffer is refilled the next one is read (stored dtype), permuted and widened beside
    it (12 bytes per element at once); on CUDA the prefetch thread's pinned batches too.
    """
    from circuitflow.sae.architectures import get

    params = sae_param_bytes(d_in, d_sae)
    arch = get(architecture)
    wide = arch.sparse_wide_per_row if sparse else arch.wide_per_row
    if wide is None:
        raise ValueError(f"sae.fast cannot train {architecture}")
    per_row = int((wide * d_sae + SAE_NARROW_PER_ROW * d_in) * 4)
    block = max(1, min(chunk_rows, n_file_rows))
    rows = min(max(1, shuffle_buffer_rows // block) * block, n_file_rows)
    group = rows * d_in * 4
    refill = rows * d_in * (2 * dtype_bytes(storage_dtype) + 4)  # read, permuted, widened
    cuda = device.startswith("cuda")
    optimiser = resident + int(SAE_OPTIMISER_COPIES * params)
    if cuda:
        phases = (optimiser,)
        per_row_host = 5 * d_in * 4  # pinned batches queued by the prefetch thread
        host = group + refill
    else:
        phases = (optimiser + group, resident + 4 * params + group + refill)
        per_row_host = 0
        host = group
    return Estimate(
        weights=resident + params,
        per_context_device=per_row,
        per_context_host=per_row_host,
        buffers=host,
        device=device,
        fixed_device=3 * params,
        other_phases=phases,
        item="row",
    )


# Attribution: a forward with gradients on through every layer with the SAEs spliced, then the
# backward. Per token and layer, TransformerLens saves for the backward the LayerNorm (RMSNorm)
# chains of its four norm calls, q/k/v/z and the residual adds' operands (ATTRIBUTION_RESID, in
# d_model-wide tensors), the MLP activation's inputs (_mlp_copies) and 2.5 [heads, t, t] tensors
# (softmax output and the cleaned pattern); the attribution keeps the corrupted and clean
# activations and their gradients. Per token overall: the embedding's chain, the final norm and
# ATTRIBUTION_LOGITS copies of the logits (and their gradient); per spliced SAE 3.3 d_sae-wide
# fp32 tensors (features, their gradient, the corrupted features). Fixed: the weight copies the
# backward keeps (W_O and, in gated MLPs, W_gate, W_in and W_out per layer; W_U). Counted on CPU
# at fp32 by tests/test_memory_accuracy.py.
ATTRIBUTION_RESID = {"LN": 12.8, "RMS": 10.1}
ATTRIBUTION_TOKEN_RESID = {"LN": 12.2, "RMS": 8.5}
ATTRIBUTION_SCORES = 2.5
ATTRIBUTION_LOGITS = 2
ATTRIBUTION_SAE = 3.3
ATTRIBUTION_WO_COPIES = 2.3  # W_O's copy and the projections' saved layouts (LN models)


def estimate_attribution(
    model_cfg,
    n_params: int,
    prompt_length: int,
    n_saes: int,
    d_sae: int,
    compute_dtype: torch.dtype,
    device: str,
    method: str = "ig",
) -> Estimate:
    """Peak memory of the attribution stage per prompt (`method` atp or ig: integrated
    gradients runs its steps one after another, each the gradient pass of `atp`)."""
    c = dtype_bytes(compute_dtype)
    t = prompt_length
    d, h, dh, _kv, m, v = _model_dims(model_cfg)
    norm_type = str(getattr(model_cfg, "normalization_type", None) or "")
    norm = "RMS" if norm_type.startswith("RMS") else "LN"
    layer = (
        ATTRIBUTION_RESID[norm] * d
        + _mlp_copies(model_cfg, grad=True) * m
        + ATTRIBUTION_SCORES * h * t
    )
    per_token = model_cfg.n_layers * layer + ATTRIBUTION_TOKEN_RESID[norm] * d
    per_prompt = t * per_token * c + ATTRIBUTION_LOGITS * t * v * c
    per_prompt += int(ATTRIBUTION_SAE * n_saes * t * d_sae * 4)  # SAEs run in fp32
    gated = getattr(model_cfg, "gated_mlp", False)
    copies = ATTRIBUTION_WO_COPIES * h * dh * d if norm == "LN" else h * dh * d
    copies += 3 * d * m if gated else 0
    fixed = int(model_cfg.n_layers * copies * c + d * v * c)
    return Estimate(
        weights=n_params * c + n_saes * sae_param_bytes(d, d_sae),
        per_context_device=int(per_prompt),
        per_context_host=0,
        buffers=0,
        device=device,
        fixed_device=fixed,
        item="prompt",
    )


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    estimate_bytes: int
    available_bytes: int
    budget_bytes: int
    item: str = "context"

    def describe(self) -> str:
        return (
            f"memory plan: batch {self.batch_size} {self.item}s, estimated peak "
            f"{self.estimate_bytes / MiB:.0f} MiB of a {self.budget_bytes / MiB:.0f} MiB budget "
            f"({self.available_bytes / MiB:.0f} MiB available)"
        )


def plan_batch_size(
    estimate: Estimate,
    max_batch_size: int,
    fraction: float = 0.8,
    available: int | None = None,
) -> BatchPlan:
    """The largest power-of-two batch size (at most `max_batch_size`) whose estimated peak fits
    in `fraction` of the available memory; raises MemoryError when not even one item fits."""
    available = available_bytes(estimate.device) if available is None else available
    budget = int(available * fraction)
    if estimate.total(1) > budget:
        raise MemoryError(
            f"not enough memory on {estimate.device}: the work needs about "
            f"{estimate.total(1) / MiB:.0f} MiB for one {estimate.item}, {budget / MiB:.0f} MiB "
            "is available; use a larger machine, a smaller dtype or a shorter context"
        )
    batch = 1
    while batch * 2 <= max_batch_size and estimate.total(batch * 2) <= budget:
        batch *= 2
    return BatchPlan(batch, estimate.total(batch), available, budget, estimate.item)


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError)


def free_device_memory(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


INJECT_OOM_ENV = "CIRCUITFLOW_INJECT_OOM"


def injected_oom(stage: str) -> Callable[[int], None] | None:
    """Test hook (fault injection on a machine without a GPU): with
    CIRCUITFLOW_INJECT_OOM="capture,train_sae:3" a CUDA-style OutOfMemoryError is raised once in
    each named stage, at its n-th batch tried (default the first), before the batch runs. None
    when the variable does not name `stage`."""
    for item in filter(None, os.environ.get(INJECT_OOM_ENV, "").split(",")):
        name, _, nth = item.strip().partition(":")
        if name == stage:
            return _raise_oom_at(stage, int(nth or 1))
    return None


def _raise_oom_at(stage: str, at: int) -> Callable[[int], None]:
    tries = [0]

    def inject(batch_size: int) -> None:
        tries[0] += 1
        if tries[0] == at:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (injected by {INJECT_OOM_ENV} into {stage}, "
                f"batch size {batch_size})"
            )

    return inject


class OOMBackoff:
    """Run batches, halving the batch size on CUDA out-of-memory and keeping the smaller size.

    `run(fn)` calls `fn(batch_size)` until it succeeds; each OOM frees the cache and halves the
    size. Below 1 it raises MemoryError with a clear message. `inject` is a test hook: called with
    the batch size before each try, it may raise OutOfMemoryError itself; by default it is the
    CIRCUITFLOW_INJECT_OOM hook of `stage` (`injected_oom`). The one place every GPU stage
    (capture, train_sae, attribution, interventions) forms its batches through.
    """

    def __init__(
        self,
        batch_size: int,
        device: str,
        inject: Callable[[int], None] | None = None,
        on_change: Callable[[int], None] | None = None,
        stage: str | None = None,
    ):
        self.batch_size = batch_size
        self.device = str(device)
        self.inject = inject if inject is not None or stage is None else injected_oom(stage)
        self.on_change = on_change
        self.stage = stage or "batch"
        self.halvings = 0

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
                self.halvings += 1
                log.warning(
                    "%s: out of memory: batch size halved to %d", self.stage, self.batch_size
                )
                if self.on_change is not None:
                    self.on_change(self.batch_size)

    def chunks(self, n: int, fn: Callable[[int, int], T]) -> Iterator[T]:
        """`fn(start, stop)` over items [0, n) in chunks of at most `batch_size`, yielding each
        result. A chunk that runs out of memory is redone at half the size, which later chunks
        keep. `fn` must leave no lasting effect until it returns: callers accumulate what it
        returns, so a failed try is never counted."""
        start = 0
        while start < n:

            def attempt(size: int, start: int = start) -> tuple[int, T]:
                stop = min(start + size, n)
                return stop, fn(start, stop)

            start, out = self.run(attempt)
            yield out


# --- GPU presets: batch sizes per GPU type, from the estimates above ------------------------------
@dataclass(frozen=True)
class GPUType:
    name: str
    memory_bytes: int  # total memory as nvidia-smi reports it
    dtype: torch.dtype  # the model's compute dtype there (`model.dtype: auto`)


GPU_TYPES = (
    GPUType("A100-80GB", 81920 * MiB, torch.bfloat16),
    GPUType("H100-80GB", 81559 * MiB, torch.bfloat16),
    GPUType("T4-16GB", 15360 * MiB, torch.float16),
)
CUDA_RESERVED = 1024 * MiB  # CUDA context, cuBLAS workspace, allocator slack
PRESET_MODELS = ("gpt2-small", "qwen2.5-0.5b")
# What the presets assume: the real-model configs (config/gpt2-small.yaml, qwen2.5-0.5b.yaml).
PRESET_CONTEXT = 128  # capture.context_length
PRESET_CAPTURE_TOKENS = 4_194_304  # capture.n_tokens (the SAE's file)
PRESET_SAE = ("topk", 32)  # sae.architecture, sae.expansion_factor
PRESET_PROMPT_LENGTH = 32  # tokens per attribution prompt (IOI and capitals prompts are shorter)
PRESET_CAPS = {"capture": 256, "sae": SAE_AUTO_MAX_BATCH, "attribution": 256}


def gpu_presets(
    gpus: tuple[GPUType, ...] = GPU_TYPES,
    models: tuple[str, ...] = PRESET_MODELS,
    fraction: float = 0.8,
    attribution_method: str = "ig",
) -> list[dict]:
    """Per GPU type and model: the batch size each stage's memory plan picks (a power of two up
    to PRESET_CAPS; every layer's resid_post captured and spliced) and its planned peak, or 0
    where not even one item fits."""
    from circuitflow.model import architectures

    rows = []
    for gpu in gpus:
        available = gpu.memory_bytes - CUDA_RESERVED
        for name in models:
            cfg = architectures.config(name)
            n_params = architectures.n_params(cfg)
            d, layers = cfg.d_model, cfg.n_layers
            d_sae = PRESET_SAE[1] * d
            estimates = {
                "capture": estimate_forward(
                    cfg, n_params, PRESET_CONTEXT, layers, layers, gpu.dtype, "float16", "cuda"
                ),
                "sae": estimate_sae_training(
                    d,
                    d_sae,
                    PRESET_SAE[0],
                    "cuda",
                    n_file_rows=PRESET_CAPTURE_TOKENS,
                    shuffle_buffer_rows=262_144,
                    resident=n_params * dtype_bytes(gpu.dtype),
                ),
                "attribution": estimate_attribution(
                    cfg, n_params, PRESET_PROMPT_LENGTH, layers, d_sae, gpu.dtype, "cuda",
                    attribution_method,
                ),
            }  # fmt: skip
            row = {"gpu": gpu.name, "model": name, "dtype": str(gpu.dtype).removeprefix("torch.")}
            for stage, est in estimates.items():
                try:
                    plan = plan_batch_size(est, PRESET_CAPS[stage], fraction, available)
                    row[stage], row[f"{stage}_gib"] = plan.batch_size, plan.estimate_bytes / 2**30
                except MemoryError:
                    row[stage], row[f"{stage}_gib"] = 0, est.total(1) / 2**30
            rows.append(row)
    return rows


def presets_markdown(rows: list[dict] | None = None) -> str:
    """The presets as the Markdown table the README shows."""
    rows = gpu_presets() if rows is None else rows
    lines = [
        "| GPU | model | dtype | capture batch (contexts) | SAE batch (rows) | "
        "attribution batch (prompts, ig) |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]

    def cell(row: dict, stage: str) -> str:
        if not row[stage]:
            return f"does not fit ({row[f'{stage}_gib']:.1f} GiB at 1)"
        return f"{row[stage]} ({row[f'{stage}_gib']:.1f} GiB)"

    for r in rows:
        stages = " | ".join(cell(r, s) for s in ("capture", "sae", "attribution"))
        lines.append(f"| {r['gpu']} | {r['model']} | {r['dtype']} | {stages} |")
    return "\n".join(lines)


# --- whole jobs: the host memory a job's process peaks at (Slurm's mem_mb) ------------------------
# Before any work a job's process holds the interpreter and the libraries its script imports.
# Every stage script imports circuitflow.config (torch, numpy, yaml): `base`; the report and
# provenance pages add pandas, matplotlib and pyarrow: `report`; the model stages add
# TransformerLens and SAELens (transformers, datasets, h5py): `model`. Measured as the resident
# set after importing RUNTIME_MODULES in a fresh interpreter (`python -m circuitflow.memory
# runtime` re-measures; tests/test_memory_accuracy.py checks these against it), torch 2.13 CPU
# wheel, Linux x86-64, MiB, in a fresh install. The same imports measure about 20% less where
# the libraries' files have aged in the page cache (220 against 272 MiB for `base` on one
# machine: fresh files are mapped whole on first touch), so these are the upper values. A job's
# plan is this plus its work; the work estimates above leave it out (resident before they start).
RUNTIME_MODULES = {
    "base": ("circuitflow.config",),
    "report": ("circuitflow.config", "pandas", "matplotlib.pyplot", "pyarrow.parquet"),
    "model": ("circuitflow.config", "transformer_lens", "sae_lens", "h5py", "pandas",
              "matplotlib.pyplot", "pyarrow.parquet"),
    # report_gpu_hours: the report's modules and TransformerLens (the architectures' configs)
    "architectures": ("circuitflow.config", "circuitflow.report.stage", "transformer_lens"),
}  # fmt: skip
RUNTIME_MB = {"base": 272, "report": 403, "model": 625, "architectures": 561}
# A job on a GPU also maps the CUDA runtime, cuBLAS and cuDNN into its host memory (and their
# lazily loaded kernels). Not measured here (no GPU on the machine that calibrated the rest):
# PyTorch's CUDA context commonly costs 1-3 GB of host memory; 2 GiB is planned.
CUDA_HOST_MB = 2048
# attribution's feature contexts encode the activation file this many rows at a time.
CONTEXT_CHUNK_ROWS = 16384
# Loading a real model converts the checkpoint on the host: three fp32 copies at the peak.
LOAD_COPIES = 3
# What each rule's process imports; a rule not listed runs the `report` set. The embedded model's
# prompts (`report`) and capture token set (`base`) need no tokenizer; a real model's load one.
RUNTIME_KIND = {
    "provenance": "base", "provenance_run": "base", "merge_capture": "base",
    "report_gpu_hours": "architectures", "prompts": "model",
    "train_model": "model", "prefetch_model": "model", "baseline": "model",
    "capture_tokens": "model", "capture": "model", "capture_shard": "model",
    "train_sae": "model", "attribution": "model", "interventions": "model",
}  # fmt: skip
MODEL_RULES = frozenset(
    {"train_model", "prefetch_model", "baseline", "capture", "capture_shard", "train_sae",
     "attribution", "interventions"}
)  # fmt: skip


def runtime_bytes(kind: str = "model", device: str = "cpu") -> int:
    """Resident bytes of a job's process before its work: the interpreter and libraries of
    `kind` (RUNTIME_MB), plus the CUDA runtime's host share on a GPU."""
    cuda = CUDA_HOST_MB if device.startswith("cuda") else 0
    return (RUNTIME_MB[kind] + cuda) * MiB


def measure_runtime_bytes(kind: str) -> int:
    """The resident set of a fresh interpreter after importing RUNTIME_MODULES[kind]."""
    import subprocess
    import sys

    code = (
        "import importlib\n"
        f"for m in {RUNTIME_MODULES[kind]!r}: importlib.import_module(m)\n"
        # VmHWM read here: importing this module would add its own imports to the measure.
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    return int(done.stdout.split()[-1]) * 1024  # kB


def _job_work_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of a job's work at the batch sizes its config sets (see job_peak_bytes)."""
    from circuitflow.capture.files import chunk_rows_for
    from circuitflow.model import architectures

    if rule not in MODEL_RULES and rule != "capture_tokens":
        return 0
    cfg = architectures.model_cfg(config)
    n_params = architectures.n_params(cfg)
    cuda = device.startswith("cuda")
    # On CPU everything is host memory; on a GPU the host keeps what Estimate.host counts.
    c = 4 if not cuda else 2  # model.dtype auto: fp32 on CPU, 16-bit on a GPU

    def at(est: Estimate, batch: int) -> int:
        return est.host(batch) if cuda else est.total(batch)

    real = config["model"]["name"] != "embedded"
    load = LOAD_COPIES * 4 * n_params if real else 0
    capture = config.get("capture", {})
    n_ctx = getattr(cfg, "n_ctx", 128)
    t = capture.get("context_length") or (min(n_ctx, 128) if real else n_ctx)
    n_rows = int(capture.get("n_tokens", 262_144))
    if rule == "capture_tokens":  # the token set, packed and hashed (two int64 copies)
        return 2 * 8 * n_rows
    layers = len(config.get("layers") or []) or cfg.n_layers
    n_hooks = layers * len(config.get("sites") or ["resid_post"])
    dtype = torch.float32 if c == 4 else torch.bfloat16
    if rule in ("capture", "capture_shard"):
        est = estimate_forward(
            cfg, n_params, t, cfg.n_layers, n_hooks, dtype, capture.get("dtype", "float16"),
            device, buffers=n_hooks * 8 * (1 << 20),
        )  # fmt: skip
        contexts = -(-n_rows // (t - 1))
        batch = min(capture.get("batch_size") or capture.get("max_batch_size", 256), contexts)
        return max(load, at(est, batch))
    if rule == "train_sae":
        sae = config.get("sae", {})
        d_sae = sae.get("d_sae") or sae.get("expansion_factor", 8) * cfg.d_model
        chunk = chunk_rows_for(cfg.d_model, 2, n_rows)
        est = estimate_sae_training(
            cfg.d_model, d_sae, sae.get("architecture", "topk"), device, n_rows,
            sae.get("shuffle_buffer_tokens", 262_144), chunk, capture.get("dtype", "float16"),
            resident=n_params * c,
        )  # fmt: skip
        batch = sae.get("batch_size", 4096)
        batch = (
            min(SAE_AUTO_MAX_BATCH, sae.get("total_tokens", 10**6)) if batch == "auto" else batch
        )
        return max(load, at(est, int(batch)))
    if rule == "attribution":
        attr = config.get("attribution", {})
        d_sae = config.get("sae", {}).get("expansion_factor", 8) * cfg.d_model
        est = estimate_attribution(
            cfg, n_params, PRESET_PROMPT_LENGTH if real else n_ctx, n_hooks, d_sae, dtype,
            device, attr.get("method", "ig"),
        )  # fmt: skip
        work = at(est, int(attr.get("batch_size", 64)))
        if not cuda:  # feature contexts: chunks of activation rows encoded (3 d_sae-wide tensors)
            work = max(work, est.weights + CONTEXT_CHUNK_ROWS * d_sae * 4 * 3)
        return max(load, work)
    if rule == "interventions":  # batch_size x runs_per_pass sequences a pass, logits included
        iv = config.get("interventions", {})
        batch = int(iv.get("batch_size", 64)) * int(iv.get("runs_per_pass", 16))
        plen = PRESET_PROMPT_LENGTH if real else n_ctx
        est = estimate_forward(cfg, n_params, plen, None, 0, torch.float32, "float32", device)
        return max(load, at(est, batch))
    return max(load, n_params * c)  # the model's weights (train_model, baseline)


def job_peak_bytes(config: dict, rule: str, device: str = "cpu") -> int:
    """A job's planned peak resident memory on the host (what resources.mem_mb asks Slurm for):
    its process's runtime (runtime_bytes) plus its work (the stage's estimate at the config's
    batch sizes, the host's share on a GPU; the real model's load copies where larger).
    tests/test_memory_accuracy.py checks every default-DAG job against its measured max_rss."""
    kind = RUNTIME_KIND.get(rule, "report")
    if config["model"]["name"] == "embedded" and rule in ("prompts", "capture_tokens"):
        kind = "report" if rule == "prompts" else "base"
    return runtime_bytes(kind, device) + _job_work_bytes(config, rule, device)


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m circuitflow.memory",
        description="The memory planner's batch sizes per GPU type (presets).",
    )
    p.add_argument("command", choices=["presets", "runtime"])
    p.add_argument("--fraction", type=float, default=0.8, help="share of GPU memory to plan for")
    p.add_argument("--method", default="ig", choices=["ig", "atp"], help="attribution method")
    args = p.parse_args(argv)
    if args.command == "runtime":
        for kind in RUNTIME_MODULES:
            print(
                f"{kind}: {measure_runtime_bytes(kind) / MiB:.0f} MiB "
                f"(RUNTIME_MB: {RUNTIME_MB[kind]})"
            )
        return
    print(presets_markdown(gpu_presets(fraction=args.fraction, attribution_method=args.method)))


if __name__ == "__main__":
    main()
