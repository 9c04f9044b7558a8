"""What the interventions stage tests: the circuit (candidates ranked by attribution on the
selection half, the curves over circuit sizes, the smallest faithful size, and beside a circuit
of features the component circuit) and the heads whose pairs and triplets it ablates (the top
heads by attribution, inert heads left out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from circuitflow.interventions import circuits as circ
from circuitflow.interventions import features as feat
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.inputs import AttributionResults
from circuitflow.interventions.stats import Runs
from circuitflow.nodes import component_nodes, site_layer


@dataclass
class Circuits:
    curves: pd.DataFrame
    ranked: list  # candidate nodes by |attribution score| on the selection half
    size: int | None  # the circuit size reported; None when no size is faithful
    smallest: int | None  # the smallest faithful size (selection half)
    features_as_nodes: bool
    selection: Any  # mask over prompts: the selection half
    component_curves: pd.DataFrame  # the curves over the components alone
    component_ranked: list  # the components by |attribution score| on the selection half


def circuits(
    runs: Runs,
    attr: AttributionResults,
    saes: dict[str, Any],
    cfg: InterventionsConfig,
    model_cfg,
    base_seed: int,
    selection,
) -> Circuits:
    """Candidates ranked by attribution on the selection half, the curves over circuit sizes,
    the smallest faithful size on the selection half (grid, then bisection) and the attribution
    graph's own node set as a circuit; beside a circuit of features, the same over the
    components alone (the component circuit)."""
    active = None
    if attr.components is not None and len(attr.components):
        if cfg.circuit_nodes == "features" and saes:
            active = {site_layer(h): feat.active_features(runs.iv, h) for h in saes}
        ranked = circ.ranked_nodes(attr.components, attr.features, active)
    else:
        mlps = not getattr(model_cfg, "attn_only", False)
        ranked = component_nodes(model_cfg.n_layers, model_cfg.n_heads, mlps)
    claimed = circ.graph_nodes(attr.graph, ranked)
    sizes = circ.circuit_sizes(len(ranked), cfg, [cfg.circuit_size])
    curves = circ.circuit_curves(runs, ranked, sizes, cfg, base_seed, selection, named=claimed)
    curves = circ.refine_smallest(runs, ranked, curves, cfg, base_seed, selection)
    smallest = circ.smallest_faithful(curves, cfg.faithfulness_threshold)
    size = cfg.circuit_size if cfg.circuit_size is not None else smallest
    size = min(size, len(ranked)) if size is not None else None
    comp_ranked, comp_curves = ranked, curves
    if active:  # features are candidates: the component circuit is a second search
        comp_ranked = circ.ranked_nodes(attr.components)
        sizes = circ.circuit_sizes(len(comp_ranked), cfg, [])
        # Random controls at the size it finds only (refine_smallest): no figure draws this
        # search's curves.
        comp_curves = circ.circuit_curves(
            runs, comp_ranked, sizes, cfg, base_seed, selection, controls=False
        )
        comp_curves = circ.refine_smallest(
            runs, comp_ranked, comp_curves, cfg, base_seed, selection
        )
    return Circuits(
        curves, ranked, size, smallest, bool(active), selection, comp_curves.copy(), comp_ranked
    )


def _scored_heads(attr: AttributionResults, singles: pd.DataFrame) -> pd.DataFrame:
    """Heads with the score that picks the top heads: attribution's (the ablation effect when
    attribution has none)."""
    return attr.heads if attr.heads is not None and len(attr.heads) else singles


def inert_heads(attr: AttributionResults, singles: pd.DataFrame) -> list[tuple[int, int]]:
    """Heads whose score is exactly 0, such as pruned heads (W_O = 0): nothing to test, so they
    are left out of the top heads and the head sets."""
    heads = _scored_heads(attr, singles)
    return sorted((int(r.layer), int(r.head)) for r in heads[heads["score"] == 0].itertuples())


def top_heads(attr: AttributionResults, singles: pd.DataFrame, k: int) -> list[tuple[int, int]]:
    """The k heads by |attribution score| (by ablation effect when attribution has none),
    inert heads (score exactly 0) left out."""
    heads = _scored_heads(attr, singles)
    heads = heads[heads["score"] != 0]
    order = heads.reindex(heads["score"].abs().sort_values(ascending=False).index)
    return [(int(r.layer), int(r.head)) for r in order.head(k).itertuples()]
