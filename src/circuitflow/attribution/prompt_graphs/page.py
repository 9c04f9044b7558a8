"""attribution/{behaviour}/prompt_graphs.html: the behaviour's per-prompt graphs as one
self-contained page.

One prompt at a time (a menu picks it): the prompt's tokens along the bottom, one band per layer
above them and the logit on top, each node in its position's column (circuit-tracer's layout).
The thresholds re-prune as circuit-tracer's do, by cumulative share: nodes by influence on the
logit, edges by edge influence. Hover a node for its card (a feature's activation, influence and
top-activating contexts), an edge for its weight and the heads that carry it. Python hands the
page each graph's nodes up to PAGE_NODE_SHARE of the influence and their edges up to
PAGE_EDGE_SHARE (the sliders cannot show more), `prompt_graph_page.js` draws them.
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

import pandas as pd
import torch

from circuitflow.attribution.page import feature_contexts, rounded
from circuitflow.attribution.prompt_graphs import prune
from circuitflow.attribution.prompt_graphs.files import feature_fields
from circuitflow.attribution.prompt_graphs.replacement import PromptGraph
from circuitflow.io import json_text
from circuitflow.nodes import Node

PAGE_NODE_SHARE = 0.95
PAGE_EDGE_SHARE = 0.995


def context_key(layer: int, feature: int) -> str:
    """The id feature_contexts gives a transcoder feature (site mlp_out)."""
    return Node("feature", layer, feature, "mlp_out").id


def graph_data(graph: PromptGraph, pruned: prune.Pruned, edge_heads: dict, texts: list[str],
               summary: dict[str, Any], labels: dict[int, dict[int, str]] | None = None,
               neuronpedia: dict[int, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """What the page needs of one graph; a feature's label (its clerp) and Neuronpedia page as
    the graph files give them (files.feature_fields: `labels` by layer, then feature;
    `neuronpedia`, each layer's transcoder's id), its card's anchor and its card in the feature
    browser (relative to the browser's index, Node.card)."""
    kinds = graph.kinds()
    node_cum = pruned.cumulative
    always = torch.tensor([k in ("token", "logit") for k in kinds])
    shown = (node_cum <= PAGE_NODE_SHARE) | always | pruned.node_mask
    a = graph.adjacency.clone()
    a[~shown] = 0
    a[:, ~shown] = 0
    scores = prune.edge_scores(a, prune.logit_weights(kinds))
    edge_cum = prune.cumulative(scores.flatten()).reshape(scores.shape)
    keep = ((edge_cum <= PAGE_EDGE_SHARE) | pruned.edge_mask) & (a != 0)
    index = {}
    nodes = []
    for i in torch.nonzero(shown).flatten().tolist():
        kind, pos = kinds[i], graph.position(i)
        node = {"i": i, "kind": kind, "pos": pos, "influence": float(node_cum[i])}
        if kind == "feature":
            layer, _, feat = graph.features[i].tolist()
            node |= {"layer": layer, "feature": feat, "activation": float(graph.activations[i]),
                     "context": context_key(layer, feat),
                     **feature_fields(layer, feat, labels, neuronpedia),
                     "anchor": Node("feature", layer, feat, "mlp_out").anchor,
                     "card": Node("feature", layer, feat, "mlp_out").card}  # fmt: skip
        elif kind == "error":
            node["layer"] = graph.write_layer(i)
        elif kind == "logit":
            node["influence"] = 0.0
        index[i] = len(nodes)
        nodes.append(node)
    edges = []
    for t, s in torch.nonzero(keep).tolist():
        edge = {"source": index[s], "target": index[t], "weight": float(graph.adjacency[t, s]),
                "share": float(edge_cum[t, s])}  # fmt: skip
        if (t, s) in edge_heads:
            edge["heads"] = [
                {"layer": h.layer, "head": h.head, "weight": h.weight}
                for h in edge_heads[(t, s)][:3]
            ]
        edges.append(edge)
    return {
        "slug": summary["slug"],
        "tokens": texts,
        "n_layers": graph.n_layers,
        "metric": graph.metric,
        "summary": {k: summary.get(k) for k in (
            "replacement_score", "completeness_score", "kept_features", "n_features",
            "linearity_max_abs_error", "forward_equivalents")},
        "validation": {k: summary["validation"].get(k) for k in (
            "spearman", "spearman_frozen_norms", "faithfulness", "passed")},
        "nodes": nodes,
        "edges": edges,
    }  # fmt: skip


def _asset(name: str) -> str:
    return resources.files("circuitflow.attribution").joinpath(name).read_text()


CONTROLS = """
<div id="controls">
  <label>prompt <select id="prompt"></select></label>
  <label>nodes: cumulative influence share
    <input type="range" id="node-threshold" min="0.05" max="{node_max}" step="any">
    <output id="node-value"></output>
  </label>
  <label>edges: cumulative influence share
    <input type="range" id="edge-threshold" min="0.05" max="{edge_max}" step="any">
    <output id="edge-value"></output>
  </label>
  <span id="counts"></span>
</div>
<p class="meta" id="scores"></p>
<p class="help">One prompt's attribution graph in the replacement model: its tokens along the
bottom, one band per layer above them (transcoder features as circles, error nodes as grey
squares) and the behaviour's logit difference on top, each node in its position's column. Every
edge is an exact direct effect; blue helps the answer, red hurts it, width grows with |weight|.
The thresholds re-prune as circuit-tracer does: the most influential nodes (edges) until that
share of the total influence on the logit is covered. Hover a node for its card (a feature's
with its label, made by the features stage from its top tokens), an edge for its weight and the
attention heads that carry it between positions. Where the run has the feature browser
(report/features.html) and this page is opened from the results folder, a click on a feature
opens its card from the browser in a panel on the right (with a link to open it in a new tab);
the copy inside the Snakemake report cannot reach the browser's pages, so there it does not.</p>
"""


def page_html(title: str, graphs: list[dict[str, Any]], contexts: pd.DataFrame | None,
              node_threshold: float, edge_threshold: float,
              features_href: str | None = None) -> str:  # fmt: skip
    """The page; `features_href`: the feature browser's folder relative to it
    (page.browser_href), whose card of a clicked feature node the page shows in a panel; None:
    no links."""
    data = {
        "graphs": graphs,
        "contexts": feature_contexts(contexts),
        "node_threshold": node_threshold,
        "edge_threshold": edge_threshold,
        "features_href": features_href,
    }
    script_data = json_text(data).replace("<", "\\u003c")
    head = (
        f"<h1>{html.escape(title)}</h1><p class='meta'>{len(graphs)} prompt graphs; "
        f"thresholds as configured: nodes {rounded(node_threshold)}, edges "
        f"{rounded(edge_threshold)}</p>"
    )
    controls = CONTROLS.format(node_max=PAGE_NODE_SHARE, edge_max=PAGE_EDGE_SHARE)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_asset('graph_page.css')}</style></head>"
        f"<body>{head}{controls}"
        '<div id="graph-scroll"><svg id="graph" xmlns="http://www.w3.org/2000/svg"></svg></div>'
        '<div id="card" hidden></div>'
        f'<script type="application/json" id="graph-data">{script_data}</script>'
        f"<script>{_asset('feature_panel.js')}</script>"
        f"<script>{_asset('prompt_graph_page.js')}</script></body></html>\n"
    )
