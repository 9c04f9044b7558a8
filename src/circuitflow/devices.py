"""Which device and dtype a stage runs on."""

from __future__ import annotations

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
    """TF32 matmuls on Ampere+ (a free ~2x over fp32 with no visible accuracy cost here)."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
