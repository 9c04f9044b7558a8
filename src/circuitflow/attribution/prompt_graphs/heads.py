"""Which attention heads carry each edge of a prompt graph that crosses positions.

With the patterns frozen, the direct effect of a source on a target at another position is a
sum over paths, and every such path moves into the target's position for the last time
through exactly one head: at some layer, that head's attention from the target's position to
another one (after which the path stays at the target's position: the residual stream, heads'
attention to their own position). So an edge is exactly the sum of its heads' terms, each
head's term being the paths whose last move is that head. A head's terms of every edge into a
target come from one more backward row: the target's gradient routed as
replacement.FrozenModel's `through` does, contracted with each source's write as the graph's
own rows are.

Which heads get a row: for each of the `max_targets` most influential targets of kept
cross-position edges (the logit first), the `top_heads` heads (in the layers between its sources
and it) writing the most into its input (PromptGraph.head_attribution, from the rows the graph
already computed: no extra pass). At most max_targets x top_heads rows a graph, whatever its
size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitflow.attribution.prompt_graphs.replacement import PromptGraph, logit_target


@dataclass(frozen=True)
class HeadTerm:
    layer: int
    head: int
    weight: float  # the paths of the edge whose last move into the target's position is here


def cross_position_edges(graph: PromptGraph, edge_mask: torch.Tensor) -> list[tuple[int, int]]:
    """(target, source) of the kept edges whose ends sit at different positions."""
    return [
        (t, s)
        for t, s in torch.nonzero(edge_mask).tolist()
        if graph.position(t) != graph.position(s)
    ]


def candidate_heads(graph: PromptGraph, target: int, lowest: int, top: int) -> list[tuple]:
    """The `top` heads, in layers lowest..target's layer, writing the most into `target`."""
    scores = graph.head_attribution[target].abs().clone()  # [L, H]
    layers = torch.arange(graph.n_layers)[:, None]
    outside = (layers < lowest) | (layers > min(graph.read_layer(target), graph.n_layers - 1))
    scores[outside.expand_as(scores)] = -1
    order = scores.flatten().argsort(descending=True)[:top]
    n_heads = scores.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in order if scores.flatten()[i] >= 0]


def split_edges(
    graph: PromptGraph,
    edge_mask: torch.Tensor,
    top_heads: int,
    batch_size: int,
    max_targets: int | None = None,
    influence: torch.Tensor | None = None,
) -> dict[tuple[int, int], list[HeadTerm]]:
    """(target, source) -> its heads' terms, largest |weight| first, for the kept
    cross-position edges into the `max_targets` (None: every) targets most influential on the
    logit (`influence`, per node; the logit counts as the most); counted under part
    `edge_heads` in graph.passes."""
    edges = cross_position_edges(graph, edge_mask)
    if not edges or top_heads <= 0:
        return {}
    by_target: dict[int, list[int]] = {}
    for t, s in edges:
        by_target.setdefault(t, []).append(s)
    if max_targets is not None and len(by_target) > max_targets:
        rank = influence.clone() if influence is not None else torch.zeros(graph.n_nodes)
        rank[graph.logit_index] = float("inf")
        chosen = sorted(by_target, key=lambda t: -float(rank[t]))[:max_targets]
        by_target = {t: by_target[t] for t in chosen}
        edges = [(t, s) for t, s in edges if t in by_target]
    jobs = []  # (target, layer, head)
    for t, sources in by_target.items():
        lowest = min(graph.write_layer(s) for s in sources) + 1
        jobs += [(t, layer, head) for layer, head in candidate_heads(graph, t, lowest, top_heads)]
    session = graph.session
    terms: dict[tuple[int, int], list[HeadTerm]] = {edge: [] for edge in edges}
    n_pos = graph.n_pos
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]
        targets = torch.stack(
            [
                graph.features[t] if t < graph.n_features else logit_target(n_pos)
                for t, _, _ in chunk
            ]
        )
        through = torch.tensor([[layer, head] for _, layer, head in chunk])
        cols = graph.columns(session.rows(targets, through, part="edge_heads"))
        for row, (t, layer, head) in enumerate(chunk):
            for s in by_target[t]:
                terms[(t, s)].append(HeadTerm(layer, head, float(cols[row, s])))
    graph.passes = dict(session.frozen.counter.parts)
    return {edge: sorted(ts, key=lambda x: -abs(x.weight)) for edge, ts in terms.items()}
