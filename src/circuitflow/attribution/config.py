"""The `attribution:` config section (defaults: the schema's, checked by tests/attribution)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuitflow.errors import ConfigError

METHODS = ("atp", "ig")


@dataclass(frozen=True)
class AttributionConfig:
    """The `attribution:` config section (see workflow/schemas/config.schema.yaml)."""

    method: str = "ig"  # fast method for every node: atp | ig
    ig_steps: int = 10
    exact_heads: str | bool = "auto"  # auto: exact patching when the model has <= 512 heads
    exact_features: int = 16  # top features per SAE (by fast score) also patched exactly
    batch_size: int = 64
    max_prompts: int | None = None
    spearman_threshold: float = 0.8
    node_threshold: float = 0.8  # cumulative |score| share of nodes kept in the graph
    edge_threshold: float = 0.98  # cumulative |weight| share of edges kept
    max_graph_nodes: int = 40
    edges: str = "adjacent"  # adjacent (same and previous layer) | all (every earlier node)
    context_features: int = 8  # top features per SAE that get activating contexts
    n_contexts: int = 8
    context_window: int = 8
    context_max_tokens: int = 262144
    top_features_plot: int = 10

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AttributionConfig:
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"attribution: unknown keys {sorted(unknown)}")
        cfg = cls(**d)
        if cfg.method not in METHODS:
            raise ConfigError(f"attribution.method: {cfg.method!r}; allowed values: atp, ig")
        return cfg
