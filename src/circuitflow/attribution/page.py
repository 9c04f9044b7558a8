"""graph.html: the attribution graph as one self-contained page (no network access needed).

Python writes the header (numbers rounded for people: the validation, whose verdict needs every
node kind with enough nodes to pass, how many edge weights are exact, and in the report's copy
the graph's own faithfulness and completeness as a circuit with the interventions' flags, which
the report passes in), the controls and the data the page needs as JSON: the graph's nodes with
their labels and forward-pass order, every computed edge (not only the pruned ones, so the
page's thresholds can re-prune; each with its weight's source), each feature's top-activating
contexts and, once the interventions stage has run, the tokens it promotes when steered.
`graph_page.js` (plain JavaScript, inlined) lays the graph out in columns by layer, routes every
edge around the nodes it does not touch, and draws it as SVG with hover cards, path highlighting
and the threshold controls; `graph_page.css` styles it.
"""

from __future__ import annotations

import html
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow.io import json_text
from circuitflow.nodes import Node

KIND_COLOURS = {
    "embedding": "#6a3d9a",
    "head": "#1f78b4",
    "mlp": "#33a02c",
    "feature": "#ff7f00",
    "error": "#999999",
    "logit": "#e31a1c",
}
COLUMN_NAMES = {"embedding": "embedding", "head": "heads", "mlp": "MLP", "logit": "logit"}
N_CONTEXTS = 6  # contexts shown per feature card


def rounded(x: Any, digits: int = 3) -> str:
    """`x` to `digits` significant digits, for people: 0.856, 6.47, -0.00857, 1230."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        return "n/a" if x is None else str(x)
    if not math.isfinite(x):
        return str(x)
    return f"{float(f'{x:.{digits}g}'):g}"


def browser_href(page: Path | str, browser: Path | str | None) -> str | None:
    """The feature browser's folder seen from the page written to `page`, ending in "/"
    (`../`), where `browser` is the browser's index (report/features.html): a feature's card is
    this plus `Node.card` (`features/resid_post/layer_1.html#resid_post.1.f355`). Relative so the
    results folder can move; None without a browser (a run without the features stage): the
    page then links nothing."""
    if browser is None:
        return None
    folder = Path(os.path.relpath(Path(browser).resolve().parent, Path(page).resolve().parent))
    return "./" if folder == Path(".") else f"{folder.as_posix()}/"


def _node(n: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """A graph.json node plus what the page draws: short label (inside its column), full name,
    column name and forward-pass order (the column's place); a feature also its label from the
    features stage (`feature_label`, null where graph.json has none), its card's anchor and its
    card in the feature browser (relative to the browser's index, Node.card)."""
    if n["kind"] == "logit":
        extra = {"name": "logit", "label": "logit", "column": "logit", "order": n_layers + 2.0}
    else:
        node = Node.of(n["kind"], n["layer"], n["index"], n.get("site"))
        label = {"embedding": "emb", "head": f"H{node.index}", "mlp": "MLP", "error": "error"}
        extra = {
            "name": node.label,
            "label": label.get(node.kind, f"#{node.index}"),
            "column": COLUMN_NAMES.get(node.kind, node.site),
            "order": node.order,
        }
        if node.kind == "feature":
            extra |= {"feature_label": n.get("label"), "anchor": node.anchor, "card": node.card,
                      "neuronpedia": n.get("neuronpedia")}  # fmt: skip
    keys = ("id", "kind", "layer", "index", "site", "score", "score_source")
    return {k: n.get(k) for k in keys} | {"bridge": bool(n.get("bridge"))} | extra


def _split_context(text: str, token: str) -> dict[str, str]:
    """contexts.py's `text` (the maximum token in [[...]]) as before / token / after."""
    mark = f" [[{token}]] "
    at = text.find(mark) if token else -1
    if at < 0:  # an unusual decoding: show the text as it is
        return {"before": text, "token": "", "after": ""}
    return {"before": text[:at], "token": token, "after": text[at + len(mark) :]}


def feature_contexts(contexts: pd.DataFrame | None, n: int = N_CONTEXTS) -> dict[str, list]:
    """node id -> its top-activating contexts (activation, before, token, after), best first."""
    if contexts is None or contexts.empty:
        return {}
    out: dict[str, list] = {}
    for r in contexts.sort_values(["site", "layer", "feature", "rank"]).itertuples():
        node_id = Node("feature", int(r.layer), int(r.feature), r.site).id
        rows = out.setdefault(node_id, [])
        if len(rows) < n:
            rows.append({"activation": float(r.activation)} | _split_context(r.text, r.max_token))
    return out


def steering_tokens(steering: pd.DataFrame | None) -> dict[str, dict] | None:
    """node id -> what steering along the feature's decoder direction did at the largest positive
    alpha: the tokens it promotes (mean logit change), the logit difference's change, and the
    same-norm random direction's change (the control). None: the interventions stage has not
    run (the page says so)."""
    if steering is None:
        return None
    out = {}
    rows = steering[steering["alpha"] > 0] if "alpha" in steering else steering.iloc[:0]
    for (site, layer, feature), sub in rows.groupby(["site", "layer", "feature"]):
        alpha = sub["alpha"].max()
        at = sub[sub["alpha"] == alpha].set_index("direction")
        if "feature" not in at.index:
            continue
        own = at.loc["feature"]
        random = at.loc["random", "logit_diff_change"] if "random" in at.index else None
        out[Node("feature", int(layer), int(feature), site).id] = {
            "alpha": float(alpha),
            "tokens": [str(t) for t in own["top_tokens"]],
            "changes": [float(c) for c in own["top_token_logit_change"]],
            "logit_diff_change": float(own["logit_diff_change"]),
            "random_logit_diff_change": None if random is None else float(random),
        }
    return out


def page_data(
    graph: dict[str, Any],
    contexts: pd.DataFrame | None = None,
    steering: pd.DataFrame | None = None,
    features_href: str | None = None,
) -> dict[str, Any]:
    """Everything graph_page.js reads (`features_href`: the feature browser's folder relative
    to the page, browser_href; None: no links). Older graph.json files without `computed_edges` or
    `score_abs_total` fall back to the pruned edges and the graph's own nodes."""
    logit = next(n for n in graph["nodes"] if n["kind"] == "logit")
    nodes = [_node(n, int(logit["layer"])) for n in graph["nodes"]]
    inner = sum(abs(n["score"]) for n in nodes if n["kind"] != "logit")
    thresholds = graph.get("thresholds", {})
    # Without the stage's total the share is of the graph's own nodes: show them all.
    node_threshold = thresholds.get("node_threshold", 1.0) if "score_abs_total" in graph else 1.0
    return {
        "nodes": nodes,
        "edges": graph.get("computed_edges") or graph["edges"],
        "edges_pruned_in_json": "computed_edges" not in graph,
        "score_abs_total": graph.get("score_abs_total") or inner,
        "n_nodes_scored": graph.get("n_nodes_scored"),
        "node_threshold": node_threshold,
        "edge_threshold": thresholds.get("edge_threshold", 1.0),
        "method": graph.get("method"),
        "validation": graph.get("validation") or {},
        "metric_clean": graph.get("metric_clean"),
        "metric_corrupted": graph.get("metric_corrupted"),
        "colours": KIND_COLOURS,
        "contexts": feature_contexts(contexts),
        "steering": steering_tokens(steering),
        "features_href": features_href,
    }


def _verdict(passed: Any) -> str:
    return {True: "passed", False: "failed"}.get(passed, "not judged")


def _validation_lines(graph: dict[str, Any]) -> list[str]:
    """Node validation (the verdict needs every kind with enough nodes to pass), by kind, and
    the edges' validation and weights."""
    val = graph.get("validation") or {}
    failed = val.get("failed_kinds") or []
    why = (
        f"; {html.escape(', '.join(failed))} under it, and every kind with at least "
        f"{val.get('min_kind_nodes', 'n/a')} nodes must pass"
        if failed
        else ""
    )
    lines = [
        f"node scores: {html.escape(str(graph.get('method')))} (fast method) on every node, exact "
        f"patching where computed; validation Spearman {rounded(val.get('spearman'))} over "
        f"{val.get('n_nodes', 'n/a')} nodes with both ({_verdict(val.get('passed'))}, threshold "
        f"{rounded(val.get('threshold'))}{why})",
    ]
    by_kind = val.get("by_kind") or {}
    if by_kind:
        lines.append(
            "validation by kind: "
            + "; ".join(
                f"{html.escape(k)} {rounded(v.get('spearman'))} ({v.get('n_nodes', 'n/a')} nodes)"
                + (f" {_verdict(v.get('passed'))}" if v.get("passed") is not None else "")
                for k, v in sorted(by_kind.items())
            )
        )
    edge_val = graph.get("edge_validation") or {}
    if edge_val:
        lines.append(
            f"edge validation: Spearman {rounded(edge_val.get('spearman'))} over "
            f"{edge_val.get('n_edges', 'n/a')} edges"
        )
    if graph.get("edge_method"):
        lines.append(f"edges: {html.escape(str(graph['edge_method']))}")
    edges = graph.get("computed_edges") or graph.get("edges") or []
    if edges and "weight_source" in edges[0]:
        exact = sum(e.get("weight_source") == "exact" for e in edges)
        lines.append(
            f"edge weights shown: exact patching of the direct path for {exact} of {len(edges)} "
            "computed edges (every edge into the logit and the validated ones), the fast "
            "estimate elsewhere"
        )
    return lines


def _circuit_lines(graph: dict[str, Any], circuit: dict[str, Any] | None) -> list[str]:
    """The drawn graph's own faithfulness and completeness as a circuit, from the interventions
    stage's summary.json (`circuit`); before that stage has run, where to find them."""
    if circuit is None:
        return [
            "the graph as a circuit: its faithfulness and completeness are measured by the "
            "interventions stage, which runs after this page was written: see the report's copy "
            "of this page (report/&lt;behaviour&gt;/graph.html) or graph_circuit in "
            "interventions/&lt;behaviour&gt;/summary.json"
        ]
    g = circuit.get("graph_circuit")
    n_graph = sum(n["kind"] != "logit" for n in graph["nodes"])
    ablation = html.escape(str(circuit.get("ablation")))
    if not g:
        return [
            f"the graph as a circuit: none of its {n_graph} nodes is a circuit candidate of the "
            "interventions stage, so it was not scored"
        ]
    share = "" if g.get("n") == n_graph else f" ({g.get('n')} of them are circuit candidates)"
    lines = [
        f"the graph as a circuit ({n_graph} nodes at the default thresholds{share}; every other "
        f"candidate node {ablation}-ablated): faithfulness {rounded(g.get('faithfulness'))} on "
        f"the selection half, {rounded(g.get('faithfulness_heldout'))} held out (threshold "
        f"{rounded(circuit.get('faithfulness_threshold'))}); completeness "
        f"{rounded(g.get('completeness'))}, {rounded(g.get('completeness_heldout'))} held out"
    ]
    size = circuit.get("circuit_size")
    why = (circuit.get("undefined") or {}).get("faithfulness")
    if size is None and why:
        lines.append(f"faithfulness is undefined: {why}")
    elif size is None:
        lines.append("the interventions stage found no faithful circuit size by attribution rank")
    else:
        lines.append(
            f"the top {size} nodes by attribution as a circuit: faithfulness "
            f"{rounded(circuit.get('faithfulness'))} on the selection half, "
            f"{rounded(circuit.get('faithfulness_heldout'))} held out; completeness "
            f"{rounded(circuit.get('completeness'))}, "
            f"{rounded(circuit.get('completeness_heldout'))} held out"
        )
    return lines


def _flag_items(found: list[dict[str, Any]] | None) -> str:
    """The interventions summary's flags (interventions/flags.py, passed in by the report) as a
    list; nothing before that stage has run (None)."""
    if found is None:
        return ""
    if not found:
        return '<p class="meta">flags: none</p>'
    items = "".join(f"<li>{html.escape(f['text'])}</li>" for f in found)
    return f'<p class="meta flag">flags:</p><ul class="flags">{items}</ul>'


def _header(
    graph: dict[str, Any],
    title: str,
    circuit: dict[str, Any] | None = None,
    flags: list[dict[str, Any]] | None = None,
) -> str:
    """Title and the run's numbers, rounded: metric, validation (per kind and of edges when
    graph.json has them), sizes, the graph's own faithfulness and completeness as a circuit
    and the flags on them (`circuit`: interventions/summary.json, `flags`: its flags, both None
    before that stage)."""
    lines = [
        f"metric: {html.escape(str(graph.get('metric', 'logit difference')))}, "
        f"clean {rounded(graph.get('metric_clean'))}, "
        f"corrupted {rounded(graph.get('metric_corrupted'))}; "
        f"{graph.get('n_prompts', 'n/a')} prompts",
        *_validation_lines(graph),
        *_circuit_lines(graph, circuit),
    ]
    return (
        f"<h1>{html.escape(title)}</h1>"
        + "".join(f'<p class="meta">{line}</p>' for line in lines)
        + _flag_items(flags)
    )


def _asset(name: str) -> str:
    return resources.files("circuitflow.attribution").joinpath(name).read_text()


def _json_for_script(data: dict[str, Any]) -> str:
    """JSON safe inside <script>: no `</script>` or `<!--` can end or change the element."""
    return json_text(data).replace("<", "\\u003c")


CONTROLS = """
<div id="controls">
  <label>nodes: cumulative |score| share
    <input type="range" id="node-threshold" min="0" step="any"> <output id="node-value"></output>
  </label>
  <label>edges: cumulative |weight| share
    <input type="range" id="edge-threshold" min="0" max="1" step="any">
    <output id="edge-value"></output>
  </label>
  <span id="counts"></span>
</div>
<div id="legend"></div>
<p class="help">Columns run through the forward pass, one band per layer (embedding left, logit
right); within a column nodes are ordered by |score|. Node size grows with |score|, its ring is
blue when the node helps the answer and red when it hurts; edge width grows with |weight|, blue
edges help and red ones hurt. Hover a node for its card; click it to highlight its paths to the
logit (click the background or press Escape to clear). A feature's text reads its index and
label (the features stage's, made from its top tokens; the card has it whole). Where the run has
the feature browser (report/features.html) and this page is opened from the results folder, a
click on a feature (its disk or its text) also opens its card from the browser in a panel on the
right, with a link to open it in a new tab; the copy inside the Snakemake report cannot reach
the browser's pages, so there a click highlights paths only and the hover card names the card's
file. The thresholds re-prune the graph as circuit-tracer does: the largest nodes (edges) until
that share of the total is covered.</p>
"""


def graph_html(
    graph: dict[str, Any],
    title: str,
    contexts: pd.DataFrame | None = None,
    steering: pd.DataFrame | None = None,
    circuit: dict[str, Any] | None = None,
    flags: list[dict[str, Any]] | None = None,
    features_href: str | None = None,
) -> str:
    """The page: header, controls, legend and an SVG that graph_page.js draws from the data.
    `circuit`: the interventions stage's summary.json (the report's copy), whose graph_circuit
    the header states, and `flags` the flags on its numbers (interventions.flags.flags of it),
    which the header lists; `features_href`: the feature browser's folder, relative to the page
    (browser_href), whose card of a clicked feature the page shows in a panel."""
    data = _json_for_script(page_data(graph, contexts, steering, features_href))
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_asset('graph_page.css')}</style></head>"
        f"<body>{_header(graph, title, circuit, flags)}{CONTROLS}"
        '<div id="graph-scroll"><svg id="graph" xmlns="http://www.w3.org/2000/svg"></svg></div>'
        '<div id="card" hidden></div>'
        f'<script type="application/json" id="graph-data">{data}</script>'
        f"<script>{_asset('feature_panel.js')}</script>"
        f"<script>{_asset('graph_page.js')}</script></body></html>\n"
    )
