"""The `features:` config section (defaults: the schema's; workflow/schemas/config.schema.yaml),
and its checks against the rest of the config (`check`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from circuitflow.schema import schema_defaults, typed

_D = schema_defaults("features")
# features.labeller values that need no language model: the deterministic labellers, and
# `best` of them (features/labels.py); any other value names an explainer model.
DETERMINISTIC = ("tokens", "rules", "best")
_E = _D["explainer"]


@dataclass(frozen=True)
class ExplainerConfig:
    """`features.explainer`: how an explainer language model is prompted and scored."""

    contexts: int = _E["contexts"]
    max_new_tokens: int = _E["max_new_tokens"]
    examples: int = _E["examples"]
    batch_size: int = _E["batch_size"]
    checkpoint_features: int = _E["checkpoint_features"]


@dataclass(frozen=True)
class FeaturesConfig:
    """How the features stage reads the token set and what it keeps per feature."""

    n_tokens: int = _D["n_tokens"]
    k: int = _D["k"]
    samples: int = _D["samples"]
    window: tuple[int, int] = tuple(_D["window"])
    promoted_tokens: int = _D["promoted_tokens"]
    dense_threshold: float = _D["dense_threshold"]
    held_out_tokens: int = _D["held_out_tokens"]
    labeller: str = _D["labeller"]
    explainer: ExplainerConfig = field(default_factory=ExplainerConfig)
    batch_contexts: int | None = _D["batch_contexts"]  # None: planned from memory
    layers_per_job: int | None = _D["layers_per_job"]  # None: every layer in one job
    checkpoint_tokens: int = _D["checkpoint_tokens"]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> FeaturesConfig:
        """From a `features` section, whole or partial (the schema checks it)."""
        return typed(cls, d, "features")


def explainer_named(config: dict) -> str | None:
    """The explainer language model `features.labeller` names, or None (a deterministic
    labeller: labels.DETERMINISTIC)."""
    name = config["features"]["labeller"]
    return None if name in DETERMINISTIC else name


def check(config: dict, n_token_set_tokens: int, notes: list[str]) -> None:
    """The features section against the rest of the config: `features.labeller` names a
    deterministic labeller or a model that exists (a local directory with config.json, or a
    TransformerLens model name); `features.n_tokens` above the token set's counted tokens is
    noted (the stage reads all of them)."""
    from pathlib import Path

    from circuitflow.errors import ConfigError

    f = config["features"]
    name = explainer_named(config)
    if name is not None:
        path = Path(name).expanduser()
        if path.exists():
            if not (path / "config.json").is_file():
                raise ConfigError(f"features.labeller: directory {path} has no config.json")
        else:
            try:
                from transformer_lens.loading_from_pretrained import get_official_model_name

                get_official_model_name(name)
            except ValueError:
                raise ConfigError(
                    f"features.labeller: {name!r} is none of {', '.join(DETERMINISTIC)}, a "
                    "local directory with config.json nor a TransformerLens model name"
                ) from None
    if f["n_tokens"] > n_token_set_tokens:
        notes.append(
            f"config note: features.n_tokens: {f['n_tokens']:,} is more than the token set's "
            f"{n_token_set_tokens:,} tokens ({dictionary_token_key(config)}); the features "
            f"stage reads all {n_token_set_tokens:,}"
        )


def dictionary_token_key(config: dict) -> str:
    """The config key that sizes the token set."""
    from circuitflow import dictionary_sources

    return dictionary_sources.get(config).token_set_key
