"""The attribution graph: top nodes, the direct effects between them (edges), their validation
against exact patching of the same direct paths, pruning, and graph.json.

Edge u -> d is u's direct effect on d (Marks et al. 2024, "Sparse feature circuits"): the
spliced model is cut at every node (each node's tensor is a leaf holding its clean value), u is
set to its corrupted value, and the cut model recomputes what d's direct inputs now make of it,
a_d(u corrupted), exactly: one forward of the cut model per upstream node serves every d. The
step from d to the metric is linear:
    w(u -> d) = sum over positions of g_d . (a_d,clean - a_d(u corrupted)),
with g_d = dm/da_d, the total gradient the method's node scores used (methods/): on the clean
run (`method: atp`) or averaged along the activation path of integrated gradients (`ig`), kept
from the score pass for the validation prompts (scores.Kept), so the edges spend no gradient
pass of their own.
A hybrid: the step from u to d is exact because it is where a linearisation goes wrong most (an
attention pattern that moves, a feature that switches off), and it costs one forward per
upstream node, where a Jacobian needs one backward per downstream node.
w(u -> logit) is exact: the cut run's drop in the metric. A pair where d does not move when u
does, on any prompt, has no direct path (an SAE sits between them, whose features and error are
leaves of the cut model, or u never moves) and carries no edge: listed with weight 0, such pairs
took 27 of the 48 computed edges and 8 of the 24 validated ones on the embedded induction
circuit, where both methods agree on them trivially.

The exact reference of an edge patches the same direct path: d is recomputed from its direct
upstream nodes at their clean values but u at its corrupted one, then set in the clean run,
whose metric drops by m(clean) - m(clean, d <- d(u corrupted)) (for the logit, the cut run's
metric drops). `edge_validation` is the rank agreement of the two on the top edges, and
graph.json's edges carry the exact weight wherever it was computed (`weight_source`, the fast
estimate kept as `weight_fast`): on the embedded induction circuit the fast estimate gave
embedding -> head.0.2 1.9 where exact patching of the path gives 9.9 to 10.9 (two trainings).

Pruning follows circuit-tracer's cumulative rule: nodes by |score| until `node_threshold` of the
total |score| is covered (at most `max_graph_nodes`), then edges by |weight| until
`edge_threshold` of the total |weight| is covered. An SAE between kept nodes with none of its
own kept would cut every path across it (its features and error are the only direct route), so
its error node and top `bridge_features` features join as bridges: on the embedded induction
circuit the previous-token heads otherwise had no path to the induction head, whose keys they
feed through the layer-0 SAE's many small token features. `page.py` draws the graph as HTML.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.scores import Kept, node_patch, spearman
from circuitflow.attribution.splice import Batch, Spliced, iter_batches, logit_diff
from circuitflow.nodes import Node, neuronpedia_url

LOGIT = "logit"


def cumulative_keep(values: np.ndarray, share: float, cap: int | None = None) -> np.ndarray:
    """Indices of the largest |values| whose running sum first reaches `share` of the total."""
    order = np.argsort(-np.abs(values), kind="stable")
    mags = np.abs(values[order])
    total = mags.sum()
    if total == 0:
        return order[:1]
    n = int(np.searchsorted(np.cumsum(mags) / total, share - 1e-12) + 1)
    n = min(n, len(order), cap or len(order))
    return order[: max(n, 1)]


def kept_edges(edges: list[dict], nodes: list[dict], share: float) -> list[int]:
    """Indices of the edges graph.json keeps (graph.html's rule, so its default view is these):
    by |weight| until `share` of the total is covered, ranked in two groups, the edges of bridge
    nodes among themselves and the others among themselves. A bridge is there for the paths
    across its SAE, one small link per token feature, which larger weights elsewhere (exact
    ones above all) would push out of a single ranking; bridges are kept at every threshold."""
    bridges = {n["id"] for n in nodes if n.get("bridge")}
    kept: list[int] = []
    for group in (True, False):
        members = [
            i for i, e in enumerate(edges) if bool({e["source"], e["target"]} & bridges) == group
        ]
        weights = np.array([edges[i]["weight"] for i in members], dtype=float)
        kept += [members[j] for j in cumulative_keep(weights, share)] if members else []
    return sorted(kept)


def select_nodes(frame: pd.DataFrame, cfg: AttributionConfig) -> pd.DataFrame:
    """The graph's nodes: the top by cumulative |score|, then the bridges (`bridge` column)."""
    keep = cumulative_keep(frame["score"].to_numpy(), cfg.node_threshold, cfg.max_graph_nodes)
    bridges = bridge_rows(frame, keep, cfg.bridge_features)
    nodes = frame.iloc[np.sort(np.concatenate([keep, bridges]))].copy()
    nodes["bridge"] = nodes.index.isin(frame.index[bridges])
    nodes["id"] = [Node.of(r.kind, r.layer, r.index, r.site).id for r in nodes.itertuples()]
    return nodes.sort_values("order", kind="stable").reset_index(drop=True)


def bridge_rows(frame: pd.DataFrame, keep: np.ndarray, n_features: int) -> np.ndarray:
    """Positions in `frame` of the bridges: for each SAE whose hook lies strictly between the
    kept nodes (`keep`, positions) and has none of its nodes kept, its error node and its top
    `n_features` features by |score| (non-zero). None when `n_features` is 0."""
    if not n_features or not len(keep):
        return np.array([], dtype=int)
    kinds, orders = frame["kind"].to_numpy(), frame["order"].to_numpy()
    mags = frame["score"].abs().to_numpy()
    kept_orders = set(orders[keep])
    lo, hi = min(kept_orders), max(kept_orders)
    sae = (kinds == "feature") | (kinds == "error")
    out = []
    for order in np.unique(orders[sae]):
        if not lo < order < hi or order in kept_orders:
            continue
        rows = np.flatnonzero(sae & (orders == order))
        feats = rows[(kinds[rows] == "feature") & (mags[rows] > 0)]
        top = feats[np.argsort(-mags[feats], kind="stable")]
        out += [*rows[kinds[rows] == "error"], *top[:n_features]]
    return np.array(out, dtype=int)


def _upstream_ok(u, d, mode: str) -> bool:
    if u["order"] >= d["order"]:
        return False
    if mode == "all":
        return True
    return d["layer"] - u["layer"] <= 1  # same layer, or the previous one (embedding is -1)


def _select(t: torch.Tensor, kind: str, index: int) -> torch.Tensor:
    """A node's slice of its group's tensor (positions kept)."""
    if kind == "head":
        return t[:, :, index]
    if kind == "feature":
        return t[..., index]
    return t


def edge_pairs(nodes: pd.DataFrame, mode: str) -> list[tuple[int, int | None]]:
    """(upstream, downstream) row pairs of `nodes` that may carry an edge; None is the logit."""
    recs = nodes.to_dict("records")
    pairs = [
        (i, j) for j, d in enumerate(recs) for i, u in enumerate(recs) if _upstream_ok(u, d, mode)
    ]
    return pairs + [(i, None) for i in range(len(recs))]


def clean_run(sp: Spliced, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every node's clean activation (detached) and the clean metric, from one forward."""
    with torch.no_grad():
        run = sp.run(batch.clean)
    acts = {k: v.detach() for k, v in run.acts.items()}
    return acts, logit_diff(run.logits, batch.answer, batch.distractor)


@torch.no_grad()
def direct_changes(sp: Spliced, batch: Batch, clean: dict, corr: dict, u: dict):
    """The model cut at every node, every node clean but `u` corrupted: what each node
    downstream computes from its direct inputs (`raw`), and the logits."""
    index = max(int(u["index"]), 0)
    leaves = dict(clean)
    leaves[u["key"]] = node_patch(u["key"], sp.group_of[u["key"]], index, corr[u["key"]])(
        clean[u["key"]]
    )
    return sp.run(batch.clean, leaves=leaves)


def compute_edges(
    sp: Spliced, prompts: pd.DataFrame, nodes: pd.DataFrame, cfg: AttributionConfig, kept: Kept
) -> dict[tuple[str, str], float]:
    """Direct-effect edge weights between the selected nodes (and from each to the logit),
    averaged over prompts: w(u -> d) = g_d . (a_d - a_d(u corrupted)) summed over positions,
    with a_d(u corrupted) computed exactly in the cut model (one forward per upstream node),
    so the step from u to d keeps its non-linearities (an attention pattern that moves), and
    g_d = dm/da_d, the configured method's gradient kept from its score pass (`kept`, which
    holds every prompt of `prompts`); w(u -> logit) is exact. Pairs where d moved on no
    prompt (no direct path) are left out."""
    device = next(sp.model.parameters()).device
    recs = nodes.to_dict("records")
    pairs = edge_pairs(nodes, cfg.edges)
    by_up: dict[int, list[int | None]] = defaultdict(list)
    for i, j in pairs:
        by_up[i].append(j)
    sums = dict.fromkeys(pairs, 0.0)
    reached: set[tuple[int, int | None]] = set()  # pairs where d moved on some prompt
    keys = sorted({r["key"] for r in recs})
    n = 0
    for batch in iter_batches(prompts, cfg.batch_size, device):
        clean, base = clean_run(sp, batch)
        corr = sp.acts(batch.corrupted)
        grads = kept.batch_gradients(prompts.index[batch.rows], keys, device)
        for i, downs in by_up.items():
            cut = direct_changes(sp, batch, clean, corr, recs[i])
            for j in downs:
                if j is None:
                    drop = base - logit_diff(cut.logits, batch.answer, batch.distractor)
                    sums[(i, j)] += drop.sum().item()
                    moved = bool(drop.any())
                else:
                    d = recs[j]
                    change = _select(clean[d["key"]] - cut.raw[d["key"]], d["kind"], d["index"])
                    g = _select(grads[d["key"]], d["kind"], d["index"])
                    sums[(i, j)] += (g.float() * change.float()).sum().item()
                    moved = bool(change.any())
                if moved:
                    reached.add((i, j))
        n += len(batch.rows)
    ids = [r["id"] for r in recs] + [LOGIT]
    return {
        (ids[i], ids[j if j is not None else -1]): sums[(i, j)] / max(n, 1)
        for (i, j) in pairs
        if (i, j) in reached
    }


@torch.no_grad()
def exact_edges(
    sp: Spliced,
    prompts: pd.DataFrame,
    nodes: pd.DataFrame,
    edges: list[tuple[str, str]],
    cfg: AttributionConfig,
) -> dict[tuple[str, str], float]:
    """Exact patching of each edge's direct path, averaged over prompts (see the module doc)."""
    device = next(sp.model.parameters()).device
    recs = {r["id"]: r for r in nodes.to_dict("records")}
    group_of = sp.group_of
    by_up: dict[str, list[str]] = defaultdict(list)
    for u, d in edges:
        by_up[u].append(d)
    sums = dict.fromkeys(edges, 0.0)
    n = 0
    for batch in iter_batches(prompts, cfg.batch_size, device):
        clean, base = clean_run(sp, batch)
        corr = sp.acts(batch.corrupted)
        for u_id, downs in by_up.items():
            cut = direct_changes(sp, batch, clean, corr, recs[u_id])
            for d_id in downs:
                if d_id == LOGIT:
                    moved = logit_diff(cut.logits, batch.answer, batch.distractor)
                else:
                    d = recs[d_id]
                    patch = node_patch(
                        d["key"], group_of[d["key"]], max(int(d["index"]), 0), cut.raw[d["key"]]
                    )
                    run = sp.run(batch.clean, {d["key"]: patch})
                    moved = logit_diff(run.logits, batch.answer, batch.distractor)
                sums[(u_id, d_id)] += (base - moved).sum().item()
        n += len(batch.rows)
    return {e: v / max(n, 1) for e, v in sums.items()}


def validate_edges(
    sp: Spliced,
    prompts: pd.DataFrame,
    nodes: pd.DataFrame,
    edges: dict[tuple[str, str], float],
    cfg: AttributionConfig,
) -> dict[str, Any]:
    """Rank agreement of the edge weights with exact direct-path patching on the
    `validation_edges` edges of largest |weight| between two nodes (an edge into the logit is
    exact already: leaving those out, the agreement measures the linear step, from d to the
    metric)."""
    inner = [e for e in edges if e[1] != LOGIT]
    top = sorted(inner, key=lambda e: -abs(edges[e]))[: cfg.validation_edges]
    exact = exact_edges(sp, prompts, nodes, top, cfg)
    fast = np.array([edges[e] for e in top])
    reference = np.array([exact[e] for e in top])
    rho = spearman(fast, reference)
    return {
        "method": cfg.method,
        "reference": "exact patching of the direct path",
        "n_edges": len(top),
        "spearman": rho,
        "threshold": cfg.spearman_threshold,
        "passed": None if rho is None else bool(rho >= cfg.spearman_threshold),
        "edges": [
            {
                "source": u,
                "target": d,
                "weight": float(edges[(u, d)]),
                "exact": float(exact[(u, d)]),
            }
            for u, d in top
        ],
    }


def edge_records(
    edges: dict[tuple[str, str], float], edge_validation: dict[str, Any] | None, method: str
) -> list[dict[str, Any]]:
    """graph.json's edges: `weight` is the exact direct-path weight where it was computed (an
    edge into the logit, which the fast computation already takes exactly, and every edge
    `edge_validation` patched) and the fast estimate elsewhere; `weight_source` says which
    (`exact` or the method), `weight_fast` keeps the fast estimate."""
    exact = {
        (e["source"], e["target"]): float(e["exact"])
        for e in (edge_validation or {}).get("edges", [])
    }
    out = []
    for (u, d), w in edges.items():
        if (u, d) in exact:
            weight, source = exact[(u, d)], "exact"
        else:
            weight, source = float(w), "exact" if d == LOGIT else method
        record = {"source": u, "target": d, "weight": weight, "weight_source": source}
        out.append(record | {"weight_fast": float(w)})
    return out


def build_graph(
    nodes: pd.DataFrame,
    edges: dict[tuple[str, str], float],
    cfg: AttributionConfig,
    n_layers: int,
    meta: dict[str, Any],
    labels: dict[tuple[str, int], dict[int, str]] | None = None,
    neuronpedia: dict[tuple[str, int], str] | None = None,
) -> dict[str, Any]:
    """graph.json: nodes (id, kind, layer, index, score; a feature's `label` from the features
    stage, `labels` = features.read.read_labels, null where none; its `neuronpedia` page where
    its dictionary names a Neuronpedia id, `neuronpedia` = features.read.read_neuronpedia_ids),
    pruned weighted edges (by |weight|, exact where computed: edge_records), thresholds and
    every computed edge (`computed_edges`, before pruning)."""
    labels, neuronpedia = labels or {}, neuronpedia or {}

    def link(r) -> dict[str, str]:
        url = neuronpedia_url(neuronpedia.get((r["site"], int(r["layer"]))), int(r["index"]))
        return {"neuronpedia": url} if r["kind"] == "feature" and url else {}

    out_nodes = [
        {
            "id": r["id"],
            "kind": r["kind"],
            "layer": int(r["layer"]),
            "index": int(r["index"]),
            "site": r["site"],
            "score": float(r["score"]),
            "score_source": r["score_source"],
            "bridge": bool(r["bridge"]),
            "label": (
                labels.get((r["site"], int(r["layer"])), {}).get(int(r["index"]))
                if r["kind"] == "feature"
                else None
            ),
        }
        | link(r)
        for _, r in nodes.iterrows()
    ]
    total = float(meta.get("metric_clean", 0.0)) - float(meta.get("metric_corrupted", 0.0))
    out_nodes.append(
        {
            "id": "logit",
            "kind": "logit",
            "layer": n_layers,
            "index": -1,
            "site": None,
            "score": total,
            "score_source": "metric",
            "bridge": False,
            "label": None,
        }
    )
    as_dicts = edge_records(edges, meta.get("edge_validation"), cfg.method)
    out_edges = [as_dicts[i] for i in kept_edges(as_dicts, out_nodes, cfg.edge_threshold)]
    return {
        "nodes": out_nodes,
        "edges": out_edges,
        "method": meta.get("method"),
        "edge_method": f"direct effect ({meta.get('method')} through the model cut at every "
        "node, Marks et al. 2024)",
        "thresholds": {
            "node_threshold": cfg.node_threshold,
            "edge_threshold": cfg.edge_threshold,
            "max_graph_nodes": cfg.max_graph_nodes,
            "bridge_features": cfg.bridge_features,
            "edges": cfg.edges,
        },
        "n_edges_computed": len(as_dicts),
        "n_edges_exact": sum(e["weight_source"] == "exact" for e in as_dicts),
        # Before edge pruning: graph.html's edge threshold control re-prunes from these.
        "computed_edges": as_dicts,
        **{k: v for k, v in meta.items() if k != "method"},
    }
