"""The memory a cross-layer transcoder needs, planned from its files' headers alone (no tensor
is read, torch is not imported: planning runs in the Snakemake process), and the one-line
refusal of a plan that cannot fit the GPU. The files: sae.cross_layer_files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from circuitflow.errors import ConfigError
from circuitflow.sae.cross_layer_files import DTYPES, CltFiles, ModelShape, open_clt

GiB = 1 << 30


@dataclass(frozen=True)
class CltMemoryPlan:
    """The memory a CLT needs, from its files' headers: elements of its encoders (W_enc, b_enc,
    b_dec, threshold, W_skip) and decoders (L(L+1)/2 blocks of [F, D]), and the bytes its files
    hold as stored (Gemma Scope 2's decoders store all L targets)."""

    label: str
    n_layers: int
    d_model: int
    d_transcoder: int
    encoder_elements: int
    decoder_elements: int
    stored_bytes: dict[str, int]  # by dtype name, as on disk

    def bytes(self, dtype: str) -> dict[str, int]:
        """Bytes of the encoders and the decoders held in `dtype` (a torch dtype name)."""
        size = next(b for n, b in DTYPES.values() if n == dtype)
        return {"encoders": self.encoder_elements * size, "decoders": self.decoder_elements * size}


def memory_plan(files: CltFiles) -> CltMemoryPlan:
    """The plan of a set opened (headers only) by open_clt."""
    enc = sum(math.prod(t.shape) for layer in files.encoders for t in layer.values())
    L, F, D = files.n_layers, files.d_transcoder, files.d_model  # noqa: N806
    stored: dict[str, int] = {}
    for t in [t for layer in files.encoders for t in layer.values()] + files.decoders:
        stored[t.dtype] = stored.get(t.dtype, 0) + t.nbytes
    return CltMemoryPlan(str(files.folder), L, D, F, enc, L * (L + 1) // 2 * F * D, stored)


def refuse_unfit(
    plan: CltMemoryPlan,
    available: int,
    dtype: str,
    *,
    lazy: bool,
    lazy_key: str,
    dtype_key: str = "model.dtype",
    other: int = 0,
) -> None:
    """ConfigError, one line, where the CLT held in `dtype` (decoders too unless `lazy`) plus
    `other` bytes (the model, activations) exceeds `available` bytes of GPU memory: the set,
    bytes needed and available, and the key to change (lazy decoders `lazy_key` where that
    is enough, else the dtype)."""
    b = plan.bytes(dtype)
    needed = b["encoders"] + (0 if lazy else b["decoders"]) + other
    if needed <= available:
        return
    if not lazy and b["encoders"] + other <= available:
        key, fix = lazy_key, "true (decoders read from disk, active rows only)"
    else:
        key, fix = dtype_key, "a smaller dtype, or use a GPU with more memory"
    held = "encoders" if lazy else "encoders and decoders"
    raise ConfigError(
        f"{key}: the CLT {plan.label} needs {needed} bytes ({needed / GiB:.2f} GiB: {held} in "
        f"{dtype}, {other} other) but {available} ({available / GiB:.2f} GiB) are available: "
        f"set {key} {fix}"
    )


def read_plan(folder: Path | str, model: ModelShape | None = None) -> CltMemoryPlan:
    """memory_plan of the set in `folder`, from headers alone (no tensor is read)."""
    return memory_plan(open_clt(folder, model))
