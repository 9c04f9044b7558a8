"""Circuits: the top-n nodes by attribution, their faithfulness and completeness, random
circuits as the control, and the smallest faithful size."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.stats import Runs, bootstrap_rows
from circuitflow.nodes import Node


def ranked_nodes(
    components: pd.DataFrame,
    features: pd.DataFrame | None = None,
    active: dict[tuple[str, int], np.ndarray] | None = None,
) -> list[Node]:
    """Circuit candidates by |attribution score| (ties in forward order): the components table
    (kind, layer, index, score); with `features` (attribution's features table) and `active`
    ((site, layer) -> features that fire on the prompts), also every active feature (score 0
    when attribution did not score it) and the error term of each SAE in `active`."""
    scored = [
        (float(r.score), (int(r.layer), 0), Node.of(r.kind, r.layer, r.index))
        for r in components.itertuples()
    ]
    if features is not None and active:
        score = {
            (r.kind, r.site, int(r.layer), int(r.feature)): float(r.score)
            for r in features.itertuples()
        }
        for (site, layer), fired in sorted(active.items()):
            # After the layer's components: resid_post features are that layer's output.
            order = (layer, 1)
            scored.append(
                (score.get(("error", site, layer, -1), 0.0), order, Node("error", layer, -1, site))
            )
            for f in fired:
                node = Node("feature", layer, int(f), site)
                scored.append((score.get(("feature", site, layer, int(f)), 0.0), order, node))
    scored.sort(key=lambda t: (-abs(t[0]), t[1], t[2]))
    return [node for *_, node in scored]


def graph_nodes(graph: dict[str, Any] | None, universe: list[Node]) -> list[Node]:
    """The attribution graph's nodes that are circuit candidates (its claim, as a circuit)."""
    if not graph:
        return []
    ids = {node.id: node for node in universe}
    return [ids[n["id"]] for n in graph.get("nodes", []) if n["id"] in ids]


def circuit_sizes(n_nodes: int, cfg: InterventionsConfig, extra: list[int]) -> list[int]:
    if cfg.circuit_sizes is not None:
        sizes = set(cfg.circuit_sizes)
    elif n_nodes <= 64:
        sizes = set(range(n_nodes + 1))
    else:
        sizes = {0, n_nodes, *np.unique(np.geomspace(1, n_nodes, 24).round().astype(int))}
    sizes |= {n for n in extra if n is not None}
    return sorted(n for n in sizes if 0 <= n <= n_nodes)


def _ratio(num: np.ndarray, den: np.ndarray) -> float:
    return float(num / den) if den != 0 else float("nan")


def circuit_curves(
    runs: Runs,
    ranked: list[Node],
    sizes: list[int],
    cfg: InterventionsConfig,
    base_seed: int,
    named: list[Node] | None = None,
    controls: bool = True,
) -> pd.DataFrame:
    """One row per (circuit, n, draw): the top-n circuit (`circuit` = top, draw -1; faithfulness
    and completeness as mean and std across seeds), random circuits (`random`, one draw each,
    on all prompts; none when `controls` is false) and, when given, the `named` node set
    (`graph`, seed-averaged like top)."""
    universe = list(ranked)
    everything = frozenset(universe)
    base = runs.base
    n_prompts = len(base.logit_diff)
    rows = []

    def measure(circuit: frozenset, seed: int, idx: np.ndarray) -> dict[str, float]:
        empty = runs.get(everything, seed)
        m_full = base.logit_diff[idx].mean()
        m_empty = empty.logit_diff[idx].mean()
        m_c = runs.get(everything - circuit, seed).logit_diff[idx].mean()
        m_rest = runs.get(circuit, seed).logit_diff[idx].mean()
        den = m_full - m_empty
        return {
            "m_full": m_full,
            "m_empty": m_empty,
            "m_circuit": m_c,
            "m_complement": m_rest,
            "faithfulness": _ratio(m_c - m_empty, den),
            "completeness": _ratio(m_full - m_rest, den),
        }

    def seed_averaged(name: str, nodes: list[Node]) -> dict[str, Any]:
        circuit = frozenset(nodes)
        per_seed = pd.DataFrame(
            [measure(circuit, s, bootstrap_rows(n_prompts, s)) for s in runs.seeds]
        )
        row: dict[str, Any] = {"circuit": name, "n": len(circuit), "draw": -1}
        for col in per_seed:
            row[col] = float(per_seed[col].mean())
            row[f"{col}_std"] = float(per_seed[col].std(ddof=1)) if len(per_seed) > 1 else 0.0
        return row | {"nodes": [node.id for node in nodes]}

    if named:
        rows.append(seed_averaged("graph", named))
    for n in sizes:
        rows.append(seed_averaged("top", ranked[:n]))
        all_rows = np.arange(n_prompts)
        draws = cfg.n_random_circuits if controls and 0 < n < len(universe) else 0
        for draw in range(draws):
            rng = np.random.default_rng([base_seed, n, draw, 17])
            pick = [universe[i] for i in sorted(rng.choice(len(universe), n, replace=False))]
            m = measure(frozenset(pick), runs.seeds[0], all_rows)
            rows.append(
                {"circuit": "random", "n": n, "draw": draw}
                | m
                | {"faithfulness_std": np.nan, "completeness_std": np.nan}
                | {"nodes": [node.id for node in pick]}
            )
    frame = pd.DataFrame(rows)
    return frame[
        [
            "circuit",
            "n",
            "draw",
            "faithfulness",
            "faithfulness_std",
            "completeness",
            "completeness_std",
            "m_circuit",
            "m_complement",
            "m_full",
            "m_empty",
            "nodes",
        ]
    ]


def random_band(curves: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per n: mean, 5% and 95% quantile of `metric` over the random circuits."""
    rand = curves[curves["circuit"] == "random"]
    return rand.groupby("n")[metric].agg(
        mean="mean", low=lambda x: x.quantile(0.05), high=lambda x: x.quantile(0.95)
    )


def smallest_faithful(curves: pd.DataFrame, threshold: float) -> int | None:
    top = curves[(curves["circuit"] == "top") & (curves["faithfulness"] >= threshold)]
    return int(top["n"].min()) if len(top) else None


def refine_smallest(
    runs: Runs,
    ranked: list[Node],
    curves: pd.DataFrame,
    cfg: InterventionsConfig,
    base_seed: int,
) -> pd.DataFrame:
    """Bisect between the first faithful size of the grid and the largest tested size below it
    (faithfulness grows with n along the ranking, mostly): the rows of every size tried are added
    to `curves`, with random controls at the smallest faithful size found."""
    hi = smallest_faithful(curves, cfg.faithfulness_threshold)
    tested = curves.loc[curves["circuit"] == "top", "n"]
    below = tested[tested < hi] if hi is not None else tested.iloc[:0]
    if hi is None or below.empty:
        return curves
    lo, first, frames = int(below.max()), hi, [curves]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        frames.append(circuit_curves(runs, ranked, [mid], cfg, base_seed, controls=False))
        if frames[-1]["faithfulness"].iloc[0] >= cfg.faithfulness_threshold:
            hi = mid
        else:
            lo = mid
    if hi != first:  # the random control at the smallest faithful size found
        found = circuit_curves(runs, ranked, [hi], cfg, base_seed)
        frames.append(found[found["circuit"] == "random"])
    order = {"top": 0, "graph": 1, "random": 2}
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(
        ["n", "circuit", "draw"], key=lambda c: c.map(order) if c.name == "circuit" else c
    ).reset_index(drop=True)


CIRCUIT_NODE_TEXT = {
    "features": "token embedding, heads, MLPs, the SAE features that fire on the prompts and each "
    "SAE's error term",
    "components": "token embedding, heads, MLPs (SAE features tested one at a time, not as "
    "circuit nodes)",
}


def count_kinds(nodes: list[Node]) -> dict[str, int]:
    return dict(Counter(node.kind for node in nodes))


def graph_summary(curves: pd.DataFrame) -> dict[str, Any] | None:
    """Faithfulness and completeness of the attribution graph's node set."""
    rows = curves[curves["circuit"] == "graph"]
    if rows.empty:
        return None
    r = rows.iloc[0]
    return {
        "n": int(r["n"]),
        "faithfulness": float(r["faithfulness"]),
        "completeness": float(r["completeness"]),
        "nodes": list(r["nodes"]),
    }
