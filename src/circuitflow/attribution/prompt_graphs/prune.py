"""Influence, pruning and scores of a prompt graph (circuit-tracer's `graph.py` definitions).

Influence is read on the row-normalised |adjacency| (each target's incoming |edges| sum to 1):
a node's influence on the logit is the sum over every path from it to the logit of the product
of the normalised edge weights along it, w B + w B^2 + ... for logit weights w (the graph is
acyclic, so the series ends after as many terms as the graph has layers of nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def normalize(adjacency: torch.Tensor) -> torch.Tensor:
    """|adjacency| with each row scaled to sum to one (rows without edges stay zero)."""
    a = adjacency.abs()
    return a / a.sum(dim=1, keepdim=True).clamp(min=1e-10)


def influence(adjacency: torch.Tensor, weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """Each node's total influence on the weighted target nodes through the normalised graph,
    w B + w B^2 + ... (float64 sums); `weights` [n] is nonzero on the logit nodes."""
    every_row = torch.arange(len(adjacency))
    return influence_rows(adjacency, every_row, weights, max_iter)


def influence_rows(rows: torch.Tensor, row_nodes: torch.Tensor, weights: torch.Tensor,
                   max_iter: int = 1000) -> torch.Tensor:  # fmt: skip
    """`influence` of a graph of which only some rows are known: `rows` [k, n] are the rows of
    nodes `row_nodes` [k], every other row zero (the greedy visit of a capped graph, without
    its [n, n] matrix)."""
    b = normalize(rows).double()
    current = weights.double()
    total = torch.zeros_like(current)
    for _ in range(max_iter):
        current = current[row_nodes] @ b
        if not current.any():
            return total.float()
        total += current
    raise ValueError("the graph has a cycle: influence does not converge")


def cumulative_threshold(scores: torch.Tensor, share: float) -> float:
    """The smallest score among the highest scores that together make up `share` of the total
    (keeping every score >= it keeps at least that share)."""
    ordered = scores.flatten().sort(descending=True).values
    total = ordered.sum()
    if total <= 0:
        return float("inf")
    cumulative = ordered.cumsum(0) / total
    index = int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype)))
    return float(ordered[min(index, len(ordered) - 1)])


def edge_scores(adjacency: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """circuit-tracer's edge influence: each normalised edge weight times its target's
    influence on the logit (plus the target's own logit weight)."""
    return normalize(adjacency) * (influence(adjacency, weights) + weights)[:, None]


def cumulative(scores: torch.Tensor) -> torch.Tensor:
    """Each score's cumulative share of the total when sorted from the largest (circuit-tracer's
    `influence` field): the largest has the smallest; all 1 when the total is 0."""
    order = scores.argsort(descending=True, stable=True)
    out = torch.ones_like(scores)
    total = scores.sum()
    if total > 0:
        out[order] = scores[order].cumsum(0) / total
    return out


@dataclass
class Pruned:
    node_mask: torch.Tensor  # [n] bool
    edge_mask: torch.Tensor  # [n, n] bool
    node_influence: torch.Tensor  # [n] influence on the logit node(s) (theirs 0)
    cumulative: torch.Tensor  # [n] circuit-tracer's `influence` field: the share of the total
    # influence of the nodes at least as influential (the most influential node: smallest)


def logit_weights(kinds: list[str]) -> torch.Tensor:
    """Weight 1 on the logit node: the behaviour's metric, a logit difference (circuit-tracer
    weighs several logit nodes by their probabilities)."""
    is_logit = torch.tensor([k == "logit" for k in kinds], dtype=torch.float32)
    return is_logit / is_logit.sum()


def prune(
    adjacency: torch.Tensor,
    kinds: list[str],
    node_threshold: float,
    edge_threshold: float,
) -> Pruned:
    """circuit-tracer's `prune_graph`: keep the nodes (features and errors alike) making up
    `node_threshold` of the total influence on the logit, tokens and the logit always; then,
    with the rest removed, the edges making up `edge_threshold` of the total edge influence
    (normalised weight x the target's influence); then drop, until none is left, features and
    errors with no kept edge out and features with no kept edge in."""
    kinds_t = [k for k in kinds]
    is_logit = torch.tensor([k == "logit" for k in kinds_t])
    is_token = torch.tensor([k == "token" for k in kinds_t])
    is_feature = torch.tensor([k == "feature" for k in kinds_t])
    weights = logit_weights(kinds_t)
    node_inf = influence(adjacency, weights)
    node_mask = (node_inf >= cumulative_threshold(node_inf, node_threshold)) | is_logit | is_token

    a = adjacency.clone()
    a[~node_mask] = 0
    a[:, ~node_mask] = 0
    scores = edge_scores(a, weights)
    edge_mask = scores >= cumulative_threshold(scores, edge_threshold)
    edge_mask &= a != 0

    exempt = is_logit | is_token
    while True:
        edge_mask &= node_mask[:, None] & node_mask[None, :]
        keep = node_mask & (edge_mask.any(dim=0) | exempt)
        keep &= edge_mask.any(dim=1) | ~is_feature
        if bool((keep == node_mask).all()):
            break
        node_mask = keep
    return Pruned(node_mask, edge_mask, node_inf, cumulative(node_inf))


def scores(adjacency: torch.Tensor, kinds: list[str]) -> dict[str, float]:
    """circuit-tracer's `compute_graph_scores`, on the unpruned graph. `replacement_score`:
    the share of the influence on the logit that starts at tokens rather than at error nodes
    (1: features explain the output all the way down to the tokens). `completeness_score`: the
    share of each node's normalised incoming |edges| that does not come from error nodes
    (1 for nodes without inputs), averaged with weights influence + logit weight."""
    is_error = torch.tensor([k == "error" for k in kinds])
    is_token = torch.tensor([k == "token" for k in kinds])
    weights = logit_weights(kinds)
    inf = influence(adjacency, weights)
    token, error = float(inf[is_token].sum()), float(inf[is_error].sum())
    non_error = 1.0 - normalize(adjacency)[:, is_error].sum(dim=1)
    out = inf + weights
    return {
        "replacement_score": token / (token + error) if token + error > 0 else float("nan"),
        "completeness_score": float((non_error * out).sum() / out.sum()),
    }
