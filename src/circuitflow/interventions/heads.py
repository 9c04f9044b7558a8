"""Head ablations: every head alone, pairs and triplets among the top heads, random sets, and
single-head effects across behaviours."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from circuitflow.interventions.config import InterventionsConfig
from circuitflow.nodes import Node, head_nodes

if TYPE_CHECKING:  # stats imports torch; the across rule's job needs none of it
    from circuitflow.interventions.stats import Runs


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def single_heads(runs: Runs, model_cfg, attribution_heads: pd.DataFrame | None, level: float):
    rows = []
    nodes = head_nodes(model_cfg.n_layers, model_cfg.n_heads)
    runs.prefetch([[node] for node in nodes])
    for node in nodes:
        rows.append({"layer": node.layer, "head": node.index} | runs.effect([node], level))
    frame = pd.DataFrame(rows)
    if attribution_heads is not None and len(attribution_heads):
        attr = attribution_heads[["layer", "head", "score"]].rename(
            columns={"score": "attribution_score"}
        )
        frame = frame.merge(attr, on=["layer", "head"], how="left")
    else:
        frame["attribution_score"] = np.nan
    frame = frame.sort_values("score", key=np.abs, ascending=False).reset_index(drop=True)
    frame["rank"] = np.arange(1, len(frame) + 1)
    return frame


def head_sets(
    runs: Runs,
    singles: pd.DataFrame,
    top_heads: list[tuple[int, int]],
    cfg: InterventionsConfig,
    model_cfg,
    base_seed: int,
) -> pd.DataFrame:
    """Pairs, triplets, ... among `top_heads`, and random head sets of each size (control)."""
    single = {(int(r.layer), int(r.head)): r.score for r in singles.itertuples()}
    all_heads = [(n.layer, n.index) for n in head_nodes(model_cfg.n_layers, model_cfg.n_heads)]
    sets: list[tuple[str, tuple]] = []
    for size in range(2, cfg.max_set_size + 1):
        sets += [("top_k", combo) for combo in itertools.combinations(top_heads, size)]
        if size <= len(all_heads):
            for draw in range(cfg.n_random_sets):
                rng = np.random.default_rng([base_seed, size, draw, 29])
                pick = sorted(rng.choice(len(all_heads), size, replace=False))
                sets.append(("random", tuple(all_heads[i] for i in pick)))

    def nodes_of(combo: tuple) -> list[Node]:
        return [Node("head", layer, head) for layer, head in combo]

    runs.prefetch([nodes_of(combo) for _, combo in sets])
    rows = []
    for kind, combo in sets:
        nodes = nodes_of(combo)
        eff = runs.effect(nodes, cfg.ci_level)
        additive = float(sum(single[h] for h in combo))
        rows.append(
            {
                "set": kind,
                "size": len(combo),
                "heads": "+".join(head_label(*h) for h in combo),
                "layer": [h[0] for h in combo],
                "head": [h[1] for h in combo],
            }
            | eff
            | {"additive": additive, "interaction": eff["score"] - additive}
        )
    columns = ["set", "size", "heads", "layer", "head", "score", "score_std", "additive"]
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)
    return frame


def heads_across_behaviours(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Single-head ablation effects of every behaviour in one long table; `specificity` is a
    head's drop_frac on this behaviour minus its mean drop_frac on the others."""
    frames = []
    for behaviour, t in tables.items():
        cols = ["layer", "head", "score", "score_std", "drop_frac", "drop_frac_std"]
        cols += ["accuracy_change", "accuracy_change_std", "attribution_score"]
        frames.append(t[[c for c in cols if c in t]].assign(behaviour=behaviour))
    frame = pd.concat(frames, ignore_index=True)
    total = frame.groupby(["layer", "head"])["drop_frac"].transform("sum")
    count = frame.groupby(["layer", "head"])["drop_frac"].transform("count")
    others = (total - frame["drop_frac"]) / (count - 1).where(count > 1)
    frame["specificity"] = frame["drop_frac"] - others
    order = ["behaviour", "layer", "head"]
    return frame[order + [c for c in frame if c not in order]].sort_values(order)
