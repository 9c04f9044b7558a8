"""The fast attribution methods (`attribution.method`): one registry record each.

A record holds everything the pipeline needs from a method: its node-score pass over one batch
(`score_batch`, which scores.score_nodes runs on every prompt; it also returns the gradient of
the metric at each node, which its scores used and which graph.compute_edges weights the edges
by, kept for the validation prompts so the edges need no gradient pass of their own), its
forward-pass equivalents per prompt (`passes`: attribution/plan.py's `passes` charges them, so the
GPU-hours estimate and the stage's own count agree) and how the peak memory per prompt of its
score pass compares with the one gradient pass that attribution/plan.py's estimate_attribution
counts (`memory_factor`). Everything the methods share (the corrupted
forward before the score pass, the exact reference, the exact direct effects of direct.py, the
edges' cut forwards) stays in scores.py, graph.py and direct.py; the records hold only what
differs.

Adding a method `foo`:
1. a module `methods/foo.py` with its `score_batch` and `METHOD = Method("foo", ...)`, Method
   from methods/base.py (atp.py is the smallest example);
2. one line `"foo": foo.METHOD` in REGISTRY below (and `foo` in the import next to it);
3. `foo` in the enum of `attribution.method` in workflow/schemas/config.schema.yaml, which stays
   the config's single source of allowed values.
tests/attribution/test_methods.py checks that the registry and the schema's enum name the same
methods, in the same order, that attribution.config rejects anything else, that perf charges
the records' passes, and that a record added to the registry alone is what scores and edges
run; tests/attribution/test_attribution.py runs every registered method against exact patching
and its planned passes against the ones the stage counts.
"""

from __future__ import annotations

from circuitflow.attribution.methods import atp, ig
from circuitflow.attribution.methods.base import Method
from circuitflow.errors import ConfigError

__all__ = ["REGISTRY", "Method", "get"]


REGISTRY: dict[str, Method] = {
    "atp": atp.METHOD,
    "ig": ig.METHOD,
}


def get(name: str) -> Method:
    """The record of method `name`; ConfigError naming the allowed values otherwise."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        allowed = ", ".join(REGISTRY)
        raise ConfigError(f"attribution.method: {name!r}; allowed values: {allowed}") from None
