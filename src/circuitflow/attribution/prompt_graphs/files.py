"""Graph files in circuit-tracer's format (its `utils/create_graph_files.py`, schema_version 1),
so its frontend opens them: `{slug}.json` with `metadata`, `qParams`, `nodes`, `links`, and the
folder's index `graph-metadata.json` = {"graphs": [metadata, ...]}.

Node ids as circuit-tracer writes them (features `{layer}_{feature}_{pos}`, tokens
`E_{token}_{pos}`, the logit `{n_layers + 1}_{token}_{pos}`), except error nodes:
circuit-tracer's `0_{layer}_{pos}` is also the id of layer 0's feature `layer` at `pos`, so a
graph holding both would link the wrong node; ours are `{layer}_-1_{pos}` (an error node's
`feature` field is -1 there too), which the frontend treats as an opaque key. One logit node:
the behaviour's metric, logit(answer) - logit(distractor), drawn as the answer's logit. Extra
keys circuit-tracer does not read live under `circuitflow` (top level, per node, per link).
"""

from __future__ import annotations

from typing import Any

import torch

from circuitflow.attribution.prompt_graphs.prune import Pruned
from circuitflow.attribution.prompt_graphs.replacement import PromptGraph

SCHEMA_VERSION = 1
HEADS_PER_LINK = 3
DEFAULT_QPARAMS = {
    "pinnedIds": [],
    "supernodes": [],
    "linkType": "both",
    "clickedId": "",
    "sg_pos": "",
}


def cantor(layer: int, feature: int) -> int:
    """circuit-tracer's feature id for a per-layer transcoder's feature (one integer per
    (layer, feature), as its feature files are named)."""
    return (layer + feature) * (layer + feature + 1) // 2 + feature


def _node(node_id, feature, layer, pos, kind, js, **extra) -> dict[str, Any]:
    node = {
        "node_id": node_id,
        "feature": int(feature),
        "layer": str(layer),
        "ctx_idx": int(pos),
        "feature_type": kind,
        "token_prob": 0.0,
        "is_target_logit": False,
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "jsNodeId": js,
        "clerp": "",
        "influence": None,
        "activation": None,
    }
    node.update(extra)
    return node


def node_records(graph: PromptGraph, answer_text: str, distractor_text: str, answer_prob: float,
                 cumulative: torch.Tensor, labels: dict | None = None) -> list[dict]:  # fmt: skip
    """Every node of `graph`, in node order; a feature's `clerp` is its label from the features
    stage (`labels`: by layer, then feature; empty where there is none)."""
    labels = labels or {}
    nodes = []
    for i, (layer, pos, feat) in enumerate(graph.features.tolist()):
        nodes.append(
            _node(f"{layer}_{feat}_{pos}", cantor(layer, feat), layer, pos,
                  "cross layer transcoder", f"{layer}_{feat}-0",
                  influence=float(cumulative[i]), activation=float(graph.activations[i]),
                  clerp=labels.get(layer, {}).get(feat, ""))
        )  # fmt: skip
    for layer in range(graph.n_layers):
        for pos in range(graph.n_pos):
            i = graph.error_index(layer, pos)
            nodes.append(
                _node(f"{layer}_-1_{pos}", -1, layer, pos, "mlp reconstruction error",
                      f"{layer}_{pos}-0", influence=float(cumulative[i]))
            )  # fmt: skip
    for pos, tok in enumerate(graph.tokens):
        i = graph.token_index(pos)
        nodes.append(
            _node(f"E_{tok}_{pos}", pos, "E", pos, "embedding", f"E_{tok}-{pos}",
                  influence=float(cumulative[i]))
        )  # fmt: skip
    last = graph.n_pos - 1
    nodes.append(
        _node(f"{graph.n_layers + 1}_{graph.answer}_{last}", graph.answer, graph.n_layers + 1,
              last, "logit", f"L_{graph.answer}-{last}", token_prob=float(answer_prob),
              is_target_logit=True,
              clerp=f'Output "{answer_text}" (p={answer_prob:.3f}) minus "{distractor_text}"')
    )  # fmt: skip
    return nodes


def graph_file(
    graph: PromptGraph,
    pruned: Pruned,
    *,
    slug: str,
    scan: str,
    transcoder_list: list[str],
    prompt_tokens: list[str],
    prompt: str,
    node_threshold: float,
    answer_text: str,
    distractor_text: str,
    answer_prob: float,
    extra: dict[str, Any],
    edge_heads: dict | None = None,
    labels: dict[int, dict[int, str]] | None = None,
) -> dict[str, Any]:
    """The graph file's content: the kept edges of `pruned` as links (by target, then source),
    the nodes they join plus every token and logit node (as circuit-tracer writes them). A
    cross-position link also lists, under `heads`, the heads carrying most of it
    (heads.split_edges: `weight` = the paths through the head), at most HEADS_PER_LINK."""
    records = node_records(graph, answer_text, distractor_text, answer_prob, pruned.cumulative,
                           labels)  # fmt: skip
    targets, sources = torch.nonzero(pruned.edge_mask, as_tuple=True)
    edge_heads = edge_heads or {}
    links = []
    for t, s in zip(targets.tolist(), sources.tolist(), strict=True):
        link = {"source": records[s]["node_id"], "target": records[t]["node_id"],
                "weight": float(graph.adjacency[t, s])}  # fmt: skip
        if (t, s) in edge_heads:
            link["heads"] = [
                {"layer": h.layer, "head": h.head, "weight": h.weight}
                for h in edge_heads[(t, s)][:HEADS_PER_LINK]
            ]
        links.append(link)
    used = set(targets.tolist()) | set(sources.tolist())
    nodes = [
        r for i, r in enumerate(records) if i in used or r["feature_type"] in ("embedding", "logit")
    ]
    metadata = {
        "slug": slug,
        "scan": scan,
        "transcoder_list": transcoder_list,
        "prompt_tokens": prompt_tokens,
        "prompt": prompt,
        "node_threshold": node_threshold,
        "schema_version": SCHEMA_VERSION,
    }
    return {
        "metadata": metadata,
        "qParams": dict(DEFAULT_QPARAMS),
        "nodes": nodes,
        "links": links,
        "circuitflow": extra,
    }


def index(files: list[dict[str, Any]]) -> dict[str, Any]:
    """graph-metadata.json: every graph's metadata, as circuit-tracer's `add_graph_metadata`
    keeps it (its frontend lists the graphs from it)."""
    return {"graphs": [f["metadata"] for f in files]}
