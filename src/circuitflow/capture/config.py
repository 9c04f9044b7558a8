"""The `capture:` config section (defaults: the schema's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuitflow.schema import schema_defaults, typed

_D = schema_defaults("capture")


@dataclass(frozen=True)
class CaptureConfig:
    """The `capture:` config section (see workflow/schemas/config.schema.yaml): which tokens
    (capture_tokens) and how they are captured, stored and checkpointed (capture)."""

    n_tokens: int = _D["n_tokens"]
    corpus: str | None = _D["corpus"]  # None: the embedded model's own language
    split: str = _D["split"]
    text_column: str = _D["text_column"]
    context_length: int | None = _D["context_length"]  # None: from the model (tokens.py)
    exclude_bos: bool = _D["exclude_bos"]
    dtype: str = _D["dtype"]  # storage dtype: float16 | float32
    batch_size: int | None = _D["batch_size"]  # None: planned from memory
    max_batch_size: int = _D["max_batch_size"]
    memory_fraction: float = _D["memory_fraction"]
    checkpoint_tokens: int = _D["checkpoint_tokens"]
    shards: int = _D["shards"]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> CaptureConfig:
        """From a `capture` section, whole or partial (the schema checks it)."""
        return typed(cls, d, "capture")
