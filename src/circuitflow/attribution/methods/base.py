"""The record of one fast attribution method (the registry is in methods/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from circuitflow.attribution.splice import Batch, Spliced

    Acts = dict[str, torch.Tensor]
    AttributionConfig = Any  # attribution.config imports the registry


@dataclass(frozen=True)
class Method:
    """One fast attribution method (what each field is for: methods/__init__.py)."""

    name: str  # the value of attribution.method, and the suffix of the `score_<name>` columns
    # (spliced model, batch, corrupted activations, config) -> (per key, per-prompt node scores
    # [b, n_nodes]; the clean metric [b]; every node's clean activation, detached). Runs after the
    # stage's corrupted forward, which it does not count.
    score_batch: Callable[[Spliced, Batch, Acts, AttributionConfig], tuple[Acts, Any, Acts]]
    # (spliced model, batch, keys, corrupted activations, config) -> (dm/da for each key's
    # tensor, total through every path; every node's clean activation, detached; the clean
    # metric [b]).
    edge_gradients: Callable[
        [Spliced, Batch, list[str], Acts, AttributionConfig], tuple[Acts, Acts, Any]
    ]
    # Forward-pass equivalents per prompt of score_batch and of edge_gradients (a backward with
    # frozen weights counts two forwards); the corrupted forward before each is the stage's.
    passes: Callable[[AttributionConfig], float]
    gradient_passes: Callable[[AttributionConfig], float]
    # The peak memory per prompt of score_batch over that of one forward and backward with
    # every node's activation kept (what attribution/plan.py's estimate_attribution counts).
    memory_factor: float
    description: str
