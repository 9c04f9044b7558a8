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
    # [b, n_nodes]; the clean metric [b]; every node's clean activation, detached; dm/da for
    # every key's tensor, detached, total through every path: the gradient its scores used,
    # which the graph's edges are weighted by, kept for the validation prompts). Runs after the
    # stage's corrupted forward, which it does not count.
    score_batch: Callable[[Spliced, Batch, Acts, AttributionConfig], tuple[Acts, Any, Acts, Acts]]
    # Forward-pass equivalents per prompt of score_batch (a backward with frozen weights counts
    # two forwards).
    passes: Callable[[AttributionConfig], float]
    # The peak memory per prompt of score_batch over that of one forward and backward with
    # every node's activation kept (what attribution/plan.py's estimate_attribution counts).
    memory_factor: float
    description: str
