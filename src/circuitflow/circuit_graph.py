"""The attribution graph: top nodes, weighted edges between them, pruning, graph.json and HTML.

Edge weight u -> d (Marks et al. 2024, "Sparse feature circuits", linearised through the spliced
model): w = sum over positions of (a_u,clean - a_u,corr) . d(g_d . a_d)/d a_u, with
g_d = dm/da_d on the clean run held fixed. It is the attribution-patching estimate of how much of
d's contribution to the metric flows from u (total effect: through every path, including other
nodes). Edges into the logit node carry the node's own score. One backward per downstream node.

Pruning follows circuit-tracer's cumulative rule: nodes by |score| until `node_threshold` of the
total |score| is covered (at most `max_graph_nodes`), then edges by |weight| until
`edge_threshold` of the total |weight| is covered.
"""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.attribution import (
    AttributionConfig,
    Group,
    corrupted_acts,
    forward,
    iter_batches,
    logit_diff,
)

KIND_COLOURS = {
    "embedding": "#6a3d9a",
    "head": "#1f78b4",
    "mlp": "#33a02c",
    "feature": "#ff7f00",
    "error": "#999999",
    "logit": "#e31a1c",
}


def node_id(row) -> str:
    if row["kind"] == "embedding":
        return "embedding"
    if row["kind"] == "head":
        return f"head.{row['layer']}.{row['index']}"
    if row["kind"] == "mlp":
        return f"mlp.{row['layer']}"
    if row["kind"] == "error":
        return f"error.{row['site']}.{row['layer']}"
    return f"feature.{row['site']}.{row['layer']}.{row['index']}"


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
    nodes["id"] = [node_id(r) for _, r in nodes.iterrows()]
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
    groups: list[Group],
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


# --- HTML -------------------------------------------------------------------------------------
def graph_html(graph: dict[str, Any], title: str) -> str:
    """A self-contained page: inline SVG, nodes placed by layer (x) and kind (y), hover titles,
    edge width by |weight|, colour by sign. No scripts from elsewhere, no external URLs."""
    nodes = graph["nodes"]
    cols: dict[float, list[dict]] = {}
    for n in nodes:
        x_key = n["layer"] + {"embedding": 0.0, "head": 0.3, "mlp": 0.6}.get(n["kind"], 0.9)
        if n["kind"] == "logit":
            x_key = n["layer"]
        cols.setdefault(x_key, []).append(n)
    xs = sorted(cols)
    width, height = max(600, 140 * len(xs)), max(300, 60 * max(len(v) for v in cols.values()) + 60)
    pos = {}
    for ci, xk in enumerate(xs):
        col = sorted(cols[xk], key=lambda n: -abs(n["score"]))
        for ri, n in enumerate(col):
            pos[n["id"]] = (70 + ci * (width - 140) / max(len(xs) - 1, 1), 40 + ri * 60)
    wmax = max([abs(e["weight"]) for e in graph["edges"]] + [1e-9])
    smax = max([abs(n["score"]) for n in nodes] + [1e-9])
    parts = []
    for e in graph["edges"]:
        if e["source"] not in pos or e["target"] not in pos:
            continue
        (x1, y1), (x2, y2) = pos[e["source"]], pos[e["target"]]
        colour = "#2166ac" if e["weight"] > 0 else "#b2182b"
        w = 0.5 + 6 * abs(e["weight"]) / wmax
        parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            f'stroke-width="{w:.2f}" stroke-opacity="0.6"><title>'
            f"{html.escape(e['source'])} -> {html.escape(e['target'])}: {e['weight']:.4g}"
            "</title></line>"
        )
    for n in nodes:
        x, y = pos[n["id"]]
        r = 5 + 14 * abs(n["score"]) / smax
        parts.append(
            f'<g><circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{KIND_COLOURS[n["kind"]]}">'
            f"<title>{html.escape(n['id'])} ({n['kind']}), score {n['score']:.4g}</title></circle>"
            f'<text x="{x + r + 3:.1f}" y="{y + 4:.1f}" font-size="11">'
            f"{html.escape(n['id'])}</text></g>"
        )
    legend = " ".join(
        f'<span style="color:{c}">&#9679; {k}</span>' for k, c in KIND_COLOURS.items()
    )
    val = graph.get("validation", {})
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head>"
        "<body style='font-family:sans-serif'>"
        f"<h2>{html.escape(title)}</h2><p>{legend}</p>"
        f"<p>method {html.escape(str(graph.get('method')))}; validation spearman "
        f"{val.get('spearman')} (passed: {val.get('passed')}); blue edges help, red hurt.</p>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        + "".join(parts)
        + "</svg>"
        f"<script type='application/json' id='graph'>{html.escape(json.dumps(graph))}</script>"
        "</body></html>\n"
    )
