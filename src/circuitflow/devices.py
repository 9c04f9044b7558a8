"""Which device and dtype a stage runs on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from circuitflow.errors import ConfigError


def resolve_device(spec: str = "auto") -> str:
    """`auto`: CUDA when a GPU is visible, else CPU. Asking for CUDA without one is an error."""
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device: {spec!r} was asked for but no CUDA GPU is visible")
    return spec


def resolve_dtype(spec: str, device: str) -> torch.dtype:
    """`auto`: bf16 on Ampere or newer GPUs, fp16 on older GPUs, fp32 on CPU."""
    if spec != "auto":
        dtype = getattr(torch, spec)
        if dtype == torch.bfloat16 and device == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("model.dtype: bfloat16 is not supported on this GPU; use float16")
        return dtype
    if device != "cuda":
        return torch.float32
    major, _ = torch.cuda.get_device_capability()
    return torch.bfloat16 if major >= 8 else torch.float16


def enable_fast_math(device: str) -> None:
    """TF32 matmuls on Ampere+ (a free ~2x over fp32): for throughput work (capture, SAE
    training), never for a number a user reads (see precise_math)."""
    if device.startswith("cuda"):
        set_tf32(True)


def set_tf32(enabled: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")


@contextmanager
def precise_math() -> Iterator[None]:
    """Full float32 matmuls (TF32 off) inside the block: TF32 keeps 10 mantissa bits, enough to
    train on, too few for a loss difference or a patching effect a user reads."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    set_tf32(False)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        torch.set_float32_matmul_precision(precision)


def host_tensor(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """An empty host tensor to fill (through `.numpy()`) and `upload` to `device`: pinned when
    `device` is a GPU, so the copy does not block the host (one from pageable memory waits for
    the device's queue first)."""
    return torch.empty(shape, dtype=dtype, pin_memory=str(device).startswith("cuda"))


def upload(t: torch.Tensor, device) -> torch.Tensor:
    """Host tensor `t` (host_tensor's) on `device`, the host going on while a GPU copies it;
    `t` itself on a CPU."""
    return t.to(device, non_blocking=True)
