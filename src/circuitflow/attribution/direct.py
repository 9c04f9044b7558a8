"""Exact direct effects: each node's effect straight down the residual stream to the logits,
computed exactly rather than estimated by the fast method.

A node's score sums its effects along every path to the metric. The direct path (the node's
write into the residual at the answer position, read by the final norm and the unembedding)
crosses one nonlinearity, the final LayerNorm or RMSNorm, and a gradient misjudges it whenever a
node writes a large part of that residual: the norm is scale invariant, so the gradient along the
residual's own direction is near zero. On the embedded induction circuit the last layer's
features, whose only path is the direct one, scored 0.62 (atp) and 0.29 (ig) of their exact
effect, and features of the two layers could not be ranked against each other.

So both fast methods replace their estimate of the direct part,  g . (a_clean - a_corrupted)
through the node's write (g: dm/d residual, at the clean point for atp, averaged along the
path for ig), by its exact value at the clean point, where exact patching measures:

    m(x) - m(x + w),   x the clean final residual at the last position, w the node's write there

and keep their estimate of the rest (the paths through later layers), as AtP* (Kramár et al.
2024) keeps AtP and recomputes the attention softmax exactly. A feature of an SAE on the last
layer's resid_post then scores exactly its patching effect. The cost is one final norm and two
unembedding columns per prompt and node that moves at the last position: no forward pass.
"""

from __future__ import annotations

import torch

from circuitflow.attribution.splice import HookGroup, Spliced

CHUNK = 1 << 16  # writes evaluated at once: bounds the memory at CHUNK x d_model floats


def final_metric(model, resid: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor):
    """The metric (answer - distractor logit, float32) of final residuals [n, d] at the last
    position, answer and distractor [n]: the final norm, then two unembedding columns."""
    norm = getattr(model, "ln_final", None)
    y = (norm(resid) if norm is not None else resid).float()
    u = (model.W_U[:, answer] - model.W_U[:, distractor]).T.float()
    return (y * u).sum(-1) + (model.b_U[answer] - model.b_U[distractor]).float()


def writes(sp: Spliced, key: str, group: HookGroup, last: torch.Tensor):
    """What patching each node of `key` writes into the residual at the last position, given the
    node tensor's change there `last` (corrupted - clean, [b, ...]): (rows, nodes, vectors
    [n, d]) for the (prompt, node) pairs that move (features: only those active in either run)."""
    if key.endswith(":feats"):  # [b, d_sae]
        rows, nodes = last.nonzero(as_tuple=True)
        w_dec = sp.saes[group.hook].W_dec
        return rows, nodes, last[rows, nodes, None] * w_dec[nodes].to(last.dtype)
    if group.kind == "attn":  # [b, head, d_head] through each head's W_O
        w_o = sp.model.blocks[group.layer].attn.W_O
        b, h = last.shape[:2]
        vectors = torch.einsum("bhe,hed->bhd", last, w_o.to(last.dtype)).reshape(b * h, -1)
        rows = torch.arange(b, device=last.device).repeat_interleave(h)
        return rows, torch.arange(h, device=last.device).repeat(b), vectors
    rows = torch.arange(len(last), device=last.device)
    return rows, torch.zeros_like(rows), last  # embedding, MLP output, SAE error: one node


@torch.no_grad()
def with_exact_direct(sp: Spliced, batch, scores: dict, clean: dict, corr: dict, final, grad):
    """`scores` (per key, [b, n_nodes]) with each node's direct part made exact: plus
    m(x) - m(x + w) + g . w for each node's write w (writes), with x the clean final residual
    and g the fast method's gradient there (`final`, `grad` [b, p, d]), at the last position."""
    x, g = final[:, -1], grad[:, -1]
    base = final_metric(sp.model, x, batch.answer, batch.distractor)
    group_of = sp.group_of
    out = {}
    for key, values in scores.items():
        last = corr[key][:, -1] - clean[key][:, -1]
        rows, nodes, w = writes(sp, key, group_of[key], last)
        fix = torch.zeros_like(values, dtype=torch.float32)
        for s in range(0, len(rows), CHUNK):
            r, n, v = rows[s : s + CHUNK], nodes[s : s + CHUNK], w[s : s + CHUNK]
            moved = final_metric(sp.model, x[r] + v, batch.answer[r], batch.distractor[r])
            linear = -(g[r].float() * v.float()).sum(-1)
            fix.index_put_((r, n), base[r] - moved - linear, accumulate=True)
        out[key] = values + fix
    return out
