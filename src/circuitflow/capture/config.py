"""The `capture:` config section (defaults: the schema's), and its checks against the rest of
the run that `config.resolve` calls before any job (`check`, `check_corpus`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from circuitflow.errors import ConfigError
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


def check(config: dict, dims: dict[str, int]) -> None:
    """The `capture:` section against the model (`dims`: its n_ctx where known without loading
    it, config.model_dims): the context fits the model, n_tokens holds a context, and there
    are no more shards than checkpoint units."""
    capture = config["capture"]
    n_ctx = dims.get("n_ctx")
    length = capture["context_length"] or n_ctx
    if n_ctx is not None and length > n_ctx:
        raise ConfigError(
            f"capture.context_length: {length} exceeds the model's context ({n_ctx} tokens)"
        )
    if length is not None and capture["n_tokens"] < length:
        raise ConfigError(
            f"capture.n_tokens: {capture['n_tokens']} is less than one context "
            f"(capture.context_length = {length})"
        )
    if length is not None and capture["shards"] > 1:
        per_context = length - 1 if capture["exclude_bos"] else length
        n_contexts = math.ceil(capture["n_tokens"] / per_context)
        unit = max(1, math.ceil(capture["checkpoint_tokens"] / per_context))
        n_units = math.ceil(n_contexts / unit)
        if capture["shards"] > n_units:
            raise ConfigError(
                f"capture.shards: {capture['shards']} shards for {n_units} checkpoint units of "
                f"capture.n_tokens; use at most {n_units} or a smaller capture.checkpoint_tokens"
            )


def check_corpus(config: dict, embedded: bool) -> None:
    """A real model captures from a corpus; the embedded one from its own language."""
    if not embedded and not config["capture"]["corpus"]:
        raise ConfigError(
            "capture.corpus: a real model needs a corpus to capture activations from (a local "
            ".txt/.jsonl/.parquet file or directory, or a Hugging Face dataset name)"
        )
