"""The `interventions:` config section (defaults: the schema's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuitflow.schema import schema_defaults, typed

_D = schema_defaults("interventions")
# SAE features ablated exactly by the circuits' ablation scores, the top by |fast score| (the
# fast score's validation for features; the rest keep the fast score); plan.py charges them.
EXACT_FEATURES = 32


@dataclass(frozen=True)
class InterventionsConfig:
    """The `interventions:` config section (see workflow/schemas/config.schema.yaml)."""

    ablation: str = _D["ablation"]  # zero | mean | resample
    mean_reference: str = _D["mean_reference"]  # clean | corrupted prompts (mean ablation)
    batch_size: int = _D["batch_size"]
    runs_per_pass: int = _D["runs_per_pass"]  # ablated runs stacked along one pass's batch
    max_prompts: int | None = _D["max_prompts"]
    n_seeds: int = _D["n_seeds"]
    ci_level: float = _D["ci_level"]
    circuit_sizes: list[int] | None = _D["circuit_sizes"]  # null: every size (<= 64), else a grid
    circuit_size: int | None = _D["circuit_size"]  # null: the smallest faithful size
    circuit_nodes: str = _D["circuit_nodes"]  # features (+ SAE features, errors) | components
    faithfulness_threshold: float = _D["faithfulness_threshold"]
    circuit_scores: str = _D["circuit_scores"]  # atp | ig, against the run's ablation
    circuit_ig_steps: int = _D["circuit_ig_steps"]
    prune_rounds: int = _D["prune_rounds"]
    prune_max_nodes: int = _D["prune_max_nodes"]
    n_random_circuits: int = _D["n_random_circuits"]
    top_k_heads: int = _D["top_k_heads"]
    max_set_size: int = _D["max_set_size"]
    n_random_sets: int = _D["n_random_sets"]
    n_features: int = _D["n_features"]
    n_random_features: int = _D["n_random_features"]
    steering_alphas: tuple[float, ...] = tuple(float(a) for a in _D["steering_alphas"])
    top_tokens: int = _D["top_tokens"]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> InterventionsConfig:
        """From an `interventions` section, whole or partial (the schema checks it)."""
        return typed(cls, d, "interventions")
