"""Circuits: the top-n nodes of a ranking, their faithfulness and completeness, random
circuits as the control, the smallest faithful size, and MIB's CPR and CMD of a curve.

The prompts are split in two (batching.selection_half): candidates are ranked by their score
on the selection half (selection.py: against the run's ablation, or attribution's), and the
circuit size is chosen there; faithfulness and completeness are reported on the held-out half
too (`*_heldout`), which neither choice saw. Random circuits have the top circuit's make-up by
kind (as many heads, MLPs, features and error terms), drawn from the candidates of each kind.
"""

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
    column: str = "score_selection",
) -> list[Node]:
    """Circuit candidates by |attribution score| on the selection half (`column`; ties in
    forward order): the components table (kind, layer, index); with `features` (attribution's
    features table) and `active` ((site, layer) -> features that fire on the prompts, BOS left
    out), also every active feature (score 0 when attribution did not score it) and the error
    term of each SAE in `active`."""
    scored = [
        (float(getattr(r, column)), (int(r.layer), 0), Node.of(r.kind, r.layer, r.index))
        for r in components.itertuples()
    ]
    if features is not None and active:
        score = {
            (r.kind, r.site, int(r.layer), int(r.feature)): float(getattr(r, column))
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


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den != 0 else float("nan")


def matched_random(universe: list[Node], like: list[Node], rng) -> list[Node]:
    """A random circuit with the make-up of `like`: per kind, as many nodes drawn uniformly from
    the candidates of that kind."""
    pick: list[Node] = []
    for kind, count in sorted(Counter(node.kind for node in like).items()):
        pool = [node for node in universe if node.kind == kind]
        pick += [pool[i] for i in sorted(rng.choice(len(pool), count, replace=False))]
    return pick


METRICS = ("faithfulness", "completeness")
COLUMNS = ["circuit", "n", "draw"]
COLUMNS += [f"{m}{half}{std}" for half in ("", "_heldout") for m in METRICS for std in ("", "_std")]
COLUMNS += ["m_circuit", "m_complement", "m_full", "m_empty", "nodes"]


def circuit_curves(
    runs: Runs,
    ranked: list[Node],
    sizes: list[int],
    cfg: InterventionsConfig,
    base_seed: int,
    selection: np.ndarray,
    named: list[Node] | None = None,
    controls: bool = True,
    named_as: str = "graph",
) -> pd.DataFrame:
    """One row per (circuit, n, draw): the top-n circuit (`circuit` = top, draw -1), random
    circuits with its make-up by kind (`random`, one draw each; none when `controls` is false)
    and, when given, the `named` node set (`circuit` = `named_as`: `graph`, the attribution
    graph's nodes, or `pruned`, pruning.prune's circuit). Faithfulness and completeness on the
    selection half (`selection`: a mask over prompts) and on the held-out half (`*_heldout`):
    mean and std across seeds (each a bootstrap resample of the half) for top and graph, on the
    whole half for random circuits. m_* are the selection half's means."""
    universe = list(ranked)
    everything = frozenset(universe)
    base = runs.base
    halves = {"": np.flatnonzero(selection), "_heldout": np.flatnonzero(~selection)}

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
        row: dict[str, Any] = {"circuit": name, "n": len(circuit), "draw": -1}
        for half, rows in halves.items():
            per_seed = pd.DataFrame(
                [measure(circuit, s, rows[bootstrap_rows(len(rows), s)]) for s in runs.seeds]
            )
            for col in per_seed if half == "" else METRICS:
                std = float(per_seed[col].std(ddof=1)) if len(per_seed) > 1 else 0.0
                row[f"{col}{half}"], row[f"{col}{half}_std"] = float(per_seed[col].mean()), std
        return row | {"nodes": [node.id for node in nodes]}

    def whole_halves(nodes: list[Node]) -> dict[str, Any]:
        row = {}
        for half, rows in halves.items():
            m = measure(frozenset(nodes), runs.seeds[0], rows)
            row |= m if half == "" else {f"{k}{half}": m[k] for k in METRICS}
        return row

    circuits = []  # (circuit, n, draw, nodes); draw -1 is seed-averaged
    if named:
        circuits.append((named_as, len(frozenset(named)), -1, named))
    for n in sizes:
        circuits.append(("top", n, -1, ranked[:n]))
        draws = cfg.n_random_circuits if controls and 0 < n < len(universe) else 0
        for draw in range(draws):
            rng = np.random.default_rng([base_seed, n, draw, 17])
            circuits.append(("random", n, draw, matched_random(universe, ranked[:n], rng)))
    # Every ablated run the curves need, batched: the circuit alone and its complement.
    for _, _, draw, nodes in circuits:
        sets = [everything, everything - frozenset(nodes), frozenset(nodes)]
        runs.prefetch(sets, seeds=runs.seeds if draw < 0 else runs.seeds[:1], defer=True)
    runs.flush()
    rows = []
    for name, n, draw, nodes in circuits:
        if draw < 0:
            rows.append(seed_averaged(name, nodes))
        else:
            rows.append(
                {"circuit": name, "n": n, "draw": draw}
                | whole_halves(nodes)
                | {"nodes": [node.id for node in nodes]}
            )
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def faithfulness_auc(curves: pd.DataFrame, n_nodes: int, column: str) -> float | None:
    """Mean faithfulness over log circuit size: the area under the top circuits' curve against
    log n from n = 1 to every candidate, divided by log(n_nodes) (1 = faithful from one node
    on)."""
    top = curves[(curves["circuit"] == "top") & (curves["n"] >= 1)].drop_duplicates("n")
    top = top.sort_values("n")
    if n_nodes < 2 or len(top) < 2:
        return None
    x, y = np.log(top["n"].to_numpy(float)), top[column].to_numpy(float)
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / np.log(n_nodes))


def cpr_cmd(curve: dict[int, float], n_nodes: int) -> tuple[float, float]:
    """MIB's two areas (Mueller et al. 2025) of a faithfulness curve over circuit sizes
    (`curve`: n -> faithfulness, n of `n_nodes` candidates), against the share of the
    candidates kept, x = n / n_nodes in [0, 1], the curve linear between its points: CPR, the
    area under it (higher is better), and CMD, the area between it and the full model's 1
    (lower is better; a curve above 1 counts as far as one below). f(0) = 0 and f(n_nodes) = 1
    hold by definition (the empty circuit and the whole model) and are added where missing."""
    points = {0: 0.0, n_nodes: 1.0} | {int(n): float(f) for n, f in curve.items()}
    n = np.array(sorted(points), dtype=np.float64)
    x, f = n / n_nodes, np.array([points[int(k)] for k in n], dtype=np.float64)
    dx, f0, f1 = np.diff(x), f[:-1], f[1:]
    cpr = float(np.sum(dx * (f0 + f1) / 2))
    d0, d1 = 1 - f0, 1 - f1  # the gap to 1 at each end of a segment
    same = d0 * d1 >= 0
    # A segment that crosses 1 is two triangles, split where the gap is 0.
    cross = np.where(same, 0.0, d0 / np.where(same, 1.0, d0 - d1))
    gap = np.where(
        same,
        dx * np.abs(d0 + d1) / 2,
        dx * (np.abs(d0) * cross + np.abs(d1) * (1 - cross)) / 2,
    )
    return cpr, float(np.sum(gap))


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
    selection: np.ndarray,
) -> pd.DataFrame:
    """Bisect between the first faithful size of the grid and the largest tested size below it
    (faithfulness on the selection half grows with n along the ranking, mostly): the rows of
    every size tried are added to `curves`, with random controls at the smallest faithful size
    found where `curves` has none there (a size the bisection found, or any size when the grid
    ran without controls, as the component circuit's does)."""
    hi = smallest_faithful(curves, cfg.faithfulness_threshold)
    if hi is None:
        return curves
    tested = curves.loc[curves["circuit"] == "top", "n"]
    below = tested[tested < hi]
    frames = [curves]
    if not below.empty:
        lo = int(below.max())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            frames.append(
                circuit_curves(runs, ranked, [mid], cfg, base_seed, selection, controls=False)
            )
            if frames[-1]["faithfulness"].iloc[0] >= cfg.faithfulness_threshold:
                hi = mid
            else:
                lo = mid
    controlled = ((curves["circuit"] == "random") & (curves["n"] == hi)).any()
    if cfg.n_random_circuits and 0 < hi < len(ranked) and not controlled:
        found = circuit_curves(runs, ranked, [hi], cfg, base_seed, selection)
        frames.append(found[found["circuit"] == "random"])
    if len(frames) == 1:
        return curves
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


def component_summary(curves: pd.DataFrame, ranked: list[Node], threshold: float) -> dict:
    """summary.json's `component_circuit`: the smallest circuit of components (embedding, heads,
    MLPs) faithful on the selection half, from `curves` over the components alone, with its
    faithfulness and completeness on both halves and the random control held out. Components
    are shared by every prompt, so what such a circuit claims can generalise where a circuit of
    token-specific features overfits its selection prompts."""
    size = smallest_faithful(curves, threshold)
    out: dict[str, Any] = {
        "candidates": len(ranked),
        "size": size,
        "nodes": None if size is None else [node.id for node in ranked[:size]],
        "by_kind": None if size is None else count_kinds(ranked[:size]),
        "faithfulness_auc_heldout": faithfulness_auc(curves, len(ranked), "faithfulness_heldout"),
    }
    top = curves[curves["circuit"] == "top"].drop_duplicates("n").set_index("n")
    for half in ("", "_heldout"):
        for metric in METRICS:
            for std in ("", "_std"):
                column = f"{metric}{half}{std}"
                out[column] = None if size is None else float(top.loc[size, column])
    band = random_band(curves, "faithfulness_heldout")
    out["random_faithfulness_heldout"] = (
        float(band.loc[size, "mean"]) if size is not None and size in band.index else None
    )
    return out


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
        "faithfulness_heldout": float(r["faithfulness_heldout"]),
        "completeness_heldout": float(r["completeness_heldout"]),
        "nodes": list(r["nodes"]),
    }
