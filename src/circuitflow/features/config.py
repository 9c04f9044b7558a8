"""The `features:` config section (defaults: the schema's; workflow/schemas/config.schema.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuitflow.schema import schema_defaults, typed

_D = schema_defaults("features")


@dataclass(frozen=True)
class FeaturesConfig:
    """How the features stage reads the token set and what it keeps per feature."""

    n_tokens: int = _D["n_tokens"]
    k: int = _D["k"]
    samples: int = _D["samples"]
    window: tuple[int, int] = tuple(_D["window"])
    promoted_tokens: int = _D["promoted_tokens"]
    dense_threshold: float = _D["dense_threshold"]
    labeller: str = _D["labeller"]
    batch_contexts: int | None = _D["batch_contexts"]  # None: planned from memory
    layers_per_job: int | None = _D["layers_per_job"]  # None: every layer in one job
    checkpoint_tokens: int = _D["checkpoint_tokens"]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> FeaturesConfig:
        """From a `features` section, whole or partial (the schema checks it)."""
        return typed(cls, d, "features")
