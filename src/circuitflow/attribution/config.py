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
    validation_prompts: int = 32  # prompts exact patching and edges run on
    validation_heads: int = 24  # heads patched exactly (top by |fast score|)
    validation_features: int = 48  # features patched exactly, over every SAE
    batch_size: int = 64
    max_prompts: int | None = None
    spearman_threshold: float = 0.8
    validation_edges: int = 24  # top edges by |weight| also patched exactly (edge_validation)
    node_threshold: float = 0.8  # cumulative |score| share of nodes kept in the graph
    edge_threshold: float = 0.98  # cumulative |weight| share of edges kept
    max_graph_nodes: int = 40
    bridge_features: int = 3  # per SAE the kept nodes' paths cross with none of its nodes kept
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
