"""Graph files in circuit-tracer's format (its `utils/create_graph_files.py`, schema_version 1),
so its frontend opens them: `{slug}.json` with `metadata`, `qParams`, `nodes`, `links`, and the
folder's index `graph-metadata.json` = {"graphs": [metadata, ...]}.

Node ids as circuit-tracer writes them: features `{layer}_{feature}_{pos}` (`feature` its
id, cantor(layer, feature), as its feature files and Neuronpedia's graph viewer name it), error
nodes `0_{layer}_{pos}` (`feature` -1), tokens `E_{token}_{pos}`, the logit
`{n_layers + 1}_{token}_{pos}`. An error node's id is also that of layer 0's feature `layer` at
`pos` where that feature is in the graph: circuit-tracer's own ambiguity, kept so the files
open in its frontend and Neuronpedia's as theirs do (`jsNodeId` tells them apart, and the page
and tables here never read node ids back). `metadata.scan` names the transcoder set as
circuit-tracer does (its Hugging Face repository for circuit-tracer's own sets; config
attribution.prompt_graph_scan). One logit node: the behaviour's metric, logit(answer) -
logit(distractor), drawn as the answer's logit. Extra keys circuit-tracer does not read live
under `circuitflow` (top level: the first position's treatment and the caller's keys; per node:
a feature's Neuronpedia page where its transcoder names one) and `heads` (per link). A
cross-layer transcoder's graph is written the same way: circuit-tracer's Node.feature_node
knows one kind of feature, "cross layer transcoder", its id cantor(source layer, feature) and
its layer the source layer, for per-layer transcoders and CLTs alike.
"""

from __future__ import annotations

from typing import Any

import torch

from circuitflow.attribution.prompt_graphs.prune import Pruned
from circuitflow.attribution.prompt_graphs.replacement import PromptGraph
from circuitflow.nodes import neuronpedia_url

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


def feature_fields(layer: int, feature: int, labels: dict | None,
                   neuronpedia: dict | None) -> dict[str, Any]:  # fmt: skip
    """What every place that shows a transcoder feature says of it: its label from the features
    stage (`labels`: by layer, then feature; "" where there is none) and its Neuronpedia page
    (`neuronpedia`: its transcoder's Neuronpedia id by layer; None where it names none)."""
    label = (labels or {}).get(layer, {}).get(feature, "")
    return {"label": label, "neuronpedia": neuronpedia_url((neuronpedia or {}).get(layer), feature)}


def node_records(graph: PromptGraph, answer_text: str, distractor_text: str, answer_prob: float,
                 cumulative: torch.Tensor, labels: dict | None = None,
                 neuronpedia: dict | None = None) -> list[dict]:  # fmt: skip
    """Every node of `graph`, in node order; a feature's `clerp` and Neuronpedia page as
    feature_fields gives them."""
    nodes = []
    for i, (layer, pos, feat) in enumerate(graph.features.tolist()):
        shown = feature_fields(layer, feat, labels, neuronpedia)
        extra = (
            {"circuitflow": {"neuronpedia": shown["neuronpedia"]}} if shown["neuronpedia"] else {}
        )
        nodes.append(
            _node(f"{layer}_{feat}_{pos}", cantor(layer, feat), layer, pos,
                  "cross layer transcoder", f"{layer}_{feat}-0",
                  influence=float(cumulative[i]), activation=float(graph.activations[i]),
                  clerp=shown["label"], **extra)
        )  # fmt: skip
    for layer in range(graph.n_layers):
        for pos in range(graph.n_pos):
            i = graph.error_index(layer, pos)
            nodes.append(
                _node(f"0_{layer}_{pos}", -1, layer, pos, "mlp reconstruction error",
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
    neuronpedia: dict[int, str] | None = None,
) -> dict[str, Any]:
    """The graph file's content: the kept edges of `pruned` as links (by target, then source),
    the nodes they join plus every token and logit node (as circuit-tracer writes them). A
    cross-position link also lists, under `heads`, the heads carrying most of it
    (heads.split_edges: `weight` = the paths through the head), at most HEADS_PER_LINK.
    `neuronpedia`: each layer's transcoder's Neuronpedia id, where it names one."""
    records = node_records(graph, answer_text, distractor_text, answer_prob, pruned.cumulative,
                           labels, neuronpedia)  # fmt: skip
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
        # How the first position was treated (PromptGraph.first_position), then the caller's.
        "circuitflow": {"first_position": graph.first_position, **extra},
    }


def index(files: list[dict[str, Any]]) -> dict[str, Any]:
    """graph-metadata.json: every graph's metadata, as circuit-tracer's `add_graph_metadata`
    keeps it (its frontend lists the graphs from it)."""
    return {"graphs": [f["metadata"] for f in files]}
