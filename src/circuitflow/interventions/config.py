"""The `interventions:` config section (defaults: the schema's, checked by tests/interventions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuitflow.errors import ConfigError

CIRCUIT_NODES = ("features", "components")


@dataclass(frozen=True)
class InterventionsConfig:
    """The `interventions:` config section (see workflow/schemas/config.schema.yaml)."""

    ablation: str = "mean"  # zero | mean | resample
    mean_reference: str = "clean"  # clean | corrupted prompts (mean ablation)
    batch_size: int = 64
    runs_per_pass: int = 16  # ablated runs stacked along the batch of one forward pass
    max_prompts: int | None = None
    n_seeds: int = 3
    ci_level: float = 0.95
    circuit_sizes: list[int] | None = None  # null: every size when <= 64 nodes, else a grid
    circuit_size: int | None = None  # null: the smallest faithful size
    circuit_nodes: str = "features"  # features (components + SAE features + errors) | components
    faithfulness_threshold: float = 0.8
    n_random_circuits: int = 10
    top_k_heads: int = 5
    max_set_size: int = 3
    n_random_sets: int = 10
    n_features: int = 4
    n_random_features: int = 4
    steering_alphas: tuple[float, ...] = (-8.0, -4.0, -2.0, 0.0, 2.0, 4.0, 8.0)
    top_tokens: int = 5

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> InterventionsConfig:
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"interventions: unknown keys {sorted(unknown)}")
        if "steering_alphas" in d:
            d["steering_alphas"] = tuple(float(a) for a in d["steering_alphas"])
        if d.get("circuit_nodes", "features") not in CIRCUIT_NODES:
            raise ConfigError(
                f"interventions.circuit_nodes: {d['circuit_nodes']!r}; allowed values: "
                + ", ".join(CIRCUIT_NODES)
            )
        if d.get("circuit_sizes") is not None:
            d["circuit_sizes"] = [int(n) for n in d["circuit_sizes"]]
        return cls(**d)
