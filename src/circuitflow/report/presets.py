"""GPU presets: the batch size each stage's memory plan picks per GPU type and real model, and
the Markdown table docs/csd3.md shows (`python scripts/gpu_presets.py`; a test checks the table
against this code)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitflow.attribution.plan import estimate_attribution
from circuitflow.description import trained_width
from circuitflow.memory import (
    PLANNED_PROMPT_LENGTH,
    MiB,
    dtype_bytes,
    estimate_forward,
    plan_batch_size,
)
from circuitflow.model import architectures
from circuitflow.perf import dtype_name
from circuitflow.sae.plan import SAE_AUTO_MAX_BATCH, estimate_sae_training


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
    rows = []
    for gpu in gpus:
        available = gpu.memory_bytes - CUDA_RESERVED
        for name in models:
            cfg = architectures.shape(name)
            n_params = architectures.n_params(cfg)
            d, layers = cfg.d_model, cfg.n_layers
            d_sae = trained_width(None, PRESET_SAE[1], d)
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
                    cfg, n_params, PLANNED_PROMPT_LENGTH, layers, d_sae, gpu.dtype, "cuda",
                    attribution_method,
                ),
            }  # fmt: skip
            row = {"gpu": gpu.name, "model": name, "dtype": dtype_name(gpu.dtype)}
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
