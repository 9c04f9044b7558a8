"""The attribution graph: top nodes, weighted edges between them, pruning, graph.json and HTML.

Edge weight u -> d (Marks et al. 2024, "Sparse feature circuits", linearised through the spliced
model): w = sum over positions of (a_u,clean - a_u,corr) . d(g_d . a_d)/d a_u, with
g_d = dm/da_d on the clean run held fixed. It is the attribution-patching estimate of how much of
d's contribution to the metric flows from u (total effect: through every path, including other
nodes). Edges into the logit node carry the node's own score. One backward per downstream node.

Pruning follows circuit-tracer's cumulative rule: nodes by |score| until `node_threshold` of the
total |score| is covered (at most `max_graph_nodes`), then edges by |weight| until
`edge_threshold` of the total |weight| is covered. `page.py` draws the graph as HTML.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.splice import (
    HookGroup,
    corrupted_acts,
    forward,
    iter_batches,
    logit_diff,
)
from circuitflow.nodes import Node


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


def select_nodes(frame: pd.DataFrame, cfg: AttributionConfig) -> pd.DataFrame:
    keep = cumulative_keep(frame["score"].to_numpy(), cfg.node_threshold, cfg.max_graph_nodes)
    nodes = frame.iloc[np.sort(keep)].copy()
    nodes["id"] = [Node.of(r.kind, r.layer, r.index, r.site).id for r in nodes.itertuples()]
    return nodes.sort_values("order", kind="stable").reset_index(drop=True)


def _upstream_ok(u, d, mode: str) -> bool:
    if u["order"] >= d["order"]:
        return False
    if mode == "all":
        return True
    return d["layer"] - u["layer"] <= 1  # same layer, or the previous one (embedding is -1)


def _select(t: torch.Tensor, kind: str, index: int) -> torch.Tensor:
    """A node's slice of its group's activation (positions kept)."""
    if kind == "head":
        return t[:, :, index]
    if kind == "feature":
        return t[..., index]
    return t


def compute_edges(
    model,
    prompts: pd.DataFrame,
    saes: dict[str, Any],
    groups: list[HookGroup],
    nodes: pd.DataFrame,
    cfg: AttributionConfig,
) -> dict[tuple[str, str], float]:
    """Edge weights between the selected nodes, averaged over prompts."""
    device = next(model.parameters()).device
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    recs = nodes.to_dict("records")
    pairs = [
        (i, j)
        for j, d in enumerate(recs)
        for i, u in enumerate(recs)
        if _upstream_ok(u, d, cfg.edges)
    ]
    sums = {p: 0.0 for p in pairs}
    n = 0
    for batch in iter_batches(prompts, cfg.batch_size, device):
        corr = corrupted_acts(model, batch, groups, saes)
        with torch.enable_grad():
            run = forward(model, batch.clean, groups, saes)
            metric = logit_diff(run.logits, batch.answer, batch.distractor)
            keys = sorted({r["key"] for r in recs})
            grads = dict(
                zip(
                    keys,
                    torch.autograd.grad(
                        metric.sum(), [run.acts[k] for k in keys], retain_graph=True
                    ),
                    strict=True,
                )
            )
            for j, d in enumerate(recs):
                ups = [i for (i, jj) in pairs if jj == j]
                if not ups:
                    continue
                a_d = _select(run.acts[d["key"]], d["kind"], d["index"])
                g_d = _select(grads[d["key"]], d["kind"], d["index"]).detach()
                up_keys = sorted({recs[i]["key"] for i in ups})
                vjp = torch.autograd.grad(
                    (g_d * a_d).sum(),
                    [run.acts[k] for k in up_keys],
                    retain_graph=True,
                    allow_unused=True,
                )
                vjp = dict(zip(up_keys, vjp, strict=True))
                for i in ups:
                    u = recs[i]
                    v = vjp[u["key"]]
                    if v is None:
                        continue
                    delta = run.acts[u["key"]].detach() - corr[u["key"]]
                    prod = _select(v * delta, u["kind"], u["index"])
                    sums[(i, j)] += prod.float().sum().item()
        n += len(metric)
    return {(recs[i]["id"], recs[j]["id"]): v / n for (i, j), v in sums.items()}


def build_graph(
    nodes: pd.DataFrame,
    edges: dict[tuple[str, str], float],
    cfg: AttributionConfig,
    n_layers: int,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """graph.json: nodes (id, kind, layer, index, score), pruned weighted edges, thresholds."""
    out_nodes = [
        {
            "id": r["id"],
            "kind": r["kind"],
            "layer": int(r["layer"]),
            "index": int(r["index"]),
            "site": r["site"],
            "score": float(r["score"]),
            "score_source": r["score_source"],
        }
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
        }
    )
    all_edges = [(u, d, w) for (u, d), w in edges.items()]
    all_edges += [(r["id"], "logit", float(r["score"])) for _, r in nodes.iterrows()]
    weights = np.array([w for _, _, w in all_edges], dtype=float)
    kept = cumulative_keep(weights, cfg.edge_threshold) if len(weights) else []
    out_edges = [
        {"source": all_edges[i][0], "target": all_edges[i][1], "weight": float(all_edges[i][2])}
        for i in sorted(kept)
    ]
    return {
        "nodes": out_nodes,
        "edges": out_edges,
        "method": meta.get("method"),
        "edge_method": "attribution patching through the spliced model (total effect)",
        "thresholds": {
            "node_threshold": cfg.node_threshold,
            "edge_threshold": cfg.edge_threshold,
            "max_graph_nodes": cfg.max_graph_nodes,
            "edges": cfg.edges,
        },
        "n_edges_computed": len(all_edges),
        **{k: v for k, v in meta.items() if k != "method"},
    }
