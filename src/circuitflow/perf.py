"""FLOP counts of the GPU stages and the device's peak rate: the roofline the benchmarks measure
against (`benchmarks/gpu_suite.py`, `benchmarks/sae_train.py`, `benchmarks/attribution.py`).
A model's own FLOPs (by its architecture) are `circuitflow.model.flops`: this module knows no
model.

Counts are matrix-multiply FLOPs (2 per multiply-add), the work a perfect kernel cannot avoid;
elementwise ops are left out. Roofline share = FLOPs per token x measured tokens/s / peak rate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where a device is timed: the plans (Snakemake's) never import it
    import torch

# The work of stages that compute a number a user reads (attribution, the baseline, the
# interventions): float32 matmuls with TF32 off (devices.precise_math), on every device.
FLOAT32_NO_TF32 = "float32_no_tf32"
# Dense (no sparsity) datasheet peaks in FLOP/s by GPU and compute dtype. float32 matmuls on
# Ampere and newer run as TF32 once devices.enable_fast_math has switched it on; without it
# (FLOAT32_NO_TF32) they run on the CUDA cores.
NOMINAL_PEAK_FLOPS = {
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12, FLOAT32_NO_TF32: 19.5e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12,  # SXM
             FLOAT32_NO_TF32: 67e12},
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12, FLOAT32_NO_TF32: 67e12},
    "T4": {"float16": 65e12, "float32": 8.1e12, FLOAT32_NO_TF32: 8.1e12},
}  # fmt: skip
# Memory of each GPU above in bytes (the datasheet's, as nvidia-smi reports it in MiB): what the
# memory planner fits a job's work into before the GPU is seen (sae.stream.layers_per_job auto).
GPU_MEMORY_BYTES = {
    "A100": 81920 * 2**20,  # A100-SXM4-80GB (CSD3 ampere)
    "H100": 81559 * 2**20,  # H100 SXM 80GB
    "H200": 143771 * 2**20,
    "T4": 15360 * 2**20,
}


@dataclass(frozen=True)
class Work:
    """A job's counted work, planned from its config (each stage's `plan.job_work`): matrix
    FLOPs by compute dtype, bytes through the disk, and seconds of work that is neither (such
    as tokenising). circuitflow.resources turns it into a walltime at a cluster's rates."""

    flops: dict[str, float]
    disk_bytes: float = 0.0
    other_seconds: float = 0.0


def dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).removeprefix("torch.")


def nominal_peak_flops(device_name: str, dtype: torch.dtype | str) -> float | None:
    """The datasheet peak of a known GPU (by a fragment of its name) for `dtype`, else None."""
    for key, peaks in NOMINAL_PEAK_FLOPS.items():
        if key in device_name.upper():
            return peaks.get(dtype_name(dtype))
    return None


def synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def measured_peak_flops(
    device: str, dtype: torch.dtype | None = None, n: int = 2048, reps: int = 5, rounds: int = 3
) -> float:
    """The best rate of an n x n x n matmul on `device` in `dtype` (float32 when None) over
    `rounds` rounds."""
    import torch

    dtype = dtype or torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up (kernel selection, thread pool)
    best = 0.0
    for _ in range(rounds):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        synchronize(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def sae_training_flops_per_token(d_in: int, d_sae: int) -> float:
    """Encoder and dense decoder, forward (2 x 2 d_in d_sae) and backward (twice that)."""
    return 12.0 * d_in * d_sae


def spliced_sae_flops_per_token(d_in: int, d_sae: int) -> float:
    """One SAE spliced with its error term (attribution): an encode and two decodes."""
    return 6.0 * d_in * d_sae


def roofline_share(flops_per_item: float, items_per_s: float, peak: float) -> float:
    return flops_per_item * items_per_s / peak


class PassCounter:
    """Forward-pass equivalents a stage spent, by part, counted where the passes happen: a
    forward over a batch of B prompts counts B (a partial one, through `fraction` of the
    layers, B x fraction), a backward 2B. Divided by the stage's prompts (or contexts), it is a
    cost that compares across machines and grows visibly with the work."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self.current = "other"

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        previous, self.current = self.current, name
        try:
            yield
        finally:
            self.current = previous

    def forward(self, batch: int, fraction: float = 1.0) -> None:
        self.parts[self.current] = self.parts.get(self.current, 0.0) + batch * fraction

    def backward(self, batch: int, fraction: float = 1.0) -> None:
        self.forward(batch, 2 * fraction)

    def total(self) -> float:
        return sum(self.parts.values())

    def summary(self, n_items: int, unit: str = "prompt") -> dict:
        """`forward_equivalents_per_prompt` and its breakdown by part, per item; every stage
        uses these keys, `forward_equivalents_unit` names the item (a prompt; capture's
        context; train_sae's evaluation context)."""
        n = max(n_items, 1)
        return {
            "forward_equivalents_per_prompt": self.total() / n,
            "forward_equivalents_by_part": {k: v / n for k, v in self.parts.items()},
            "forward_equivalents_total": self.total(),
            "forward_equivalents_unit": unit,
        }
