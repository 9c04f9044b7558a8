"""The `attribution:` config section (defaults: the schema's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuitflow.attribution import methods
from circuitflow.schema import schema_defaults, typed

_D = schema_defaults("attribution")


@dataclass(frozen=True)
class AttributionConfig:
    """The `attribution:` config section (see workflow/schemas/config.schema.yaml)."""

    method: str = _D["method"]  # fast method for every node: a name in methods.REGISTRY
    ig_steps: int = _D["ig_steps"]
    validation_prompts: int = _D["validation_prompts"]  # prompts exact patching and edges run on
    validation_heads: int = _D["validation_heads"]  # heads patched exactly (top by |fast score|)
    validation_features: int = _D["validation_features"]  # features patched exactly, every SAE
    batch_size: int = _D["batch_size"]
    max_prompts: int | None = _D["max_prompts"]
    spearman_threshold: float = _D["spearman_threshold"]
    validation_edges: int = _D["validation_edges"]  # top edges by |weight| also patched exactly
    node_threshold: float = _D["node_threshold"]  # cumulative |score| share of nodes kept
    edge_threshold: float = _D["edge_threshold"]  # cumulative |weight| share of edges kept
    max_graph_nodes: int = _D["max_graph_nodes"]
    bridge_features: int = _D["bridge_features"]  # per SAE the kept paths cross, none kept
    edges: str = _D["edges"]  # adjacent (same and previous layer) | all (every earlier node)
    context_features: int = _D["context_features"]  # top features per SAE given contexts
    n_contexts: int = _D["n_contexts"]  # top contexts a feature, from the features stage
    top_features_plot: int = _D["top_features_plot"]
    # Per-prompt replacement graphs on transcoders (sae.kind transcoder; prompt_graphs/).
    prompt_graphs: int = _D["prompt_graphs"]  # the first N prompts of each behaviour
    prompt_graph_scan: str | None = _D["prompt_graph_scan"]  # metadata.scan; None: derived
    prompt_graph_node_threshold: float = _D["prompt_graph_node_threshold"]
    prompt_graph_edge_threshold: float = _D["prompt_graph_edge_threshold"]
    max_feature_nodes: int = _D["max_feature_nodes"]
    prompt_graph_batch_size: int = _D["prompt_graph_batch_size"]
    prompt_graph_edge_heads: int = _D["prompt_graph_edge_heads"]  # heads split per target
    prompt_graph_split_targets: int = _D["prompt_graph_split_targets"]  # targets split a graph
    prompt_graph_validation_features: int = _D["prompt_graph_validation_features"]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AttributionConfig:
        """From an `attribution` section, whole or partial (the schema checks it)."""
        return typed(cls, d, "attribution")

    @property
    def method_record(self) -> methods.Method:
        """The registry record of `method` (attribution/methods): what scores, edges and the
        pass counts run and charge."""
        return methods.get(self.method)
