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
layer's resid_post then scores exactly its patching effect. The cost is no forward pass: a
final norm per prompt and head or single node, and for features three [b, d] x [d, d_sae]
products per SAE (feature_fix), in fixed shapes, so nothing is read back to the host.
"""

from __future__ import annotations

import torch

from circuitflow.attribution.splice import HookGroup, Spliced
from circuitflow.devices import precise_math


def final_metric(model, resid: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor):
    """The metric (answer - distractor logit, float32) of final residuals [n, d] at the last
    position, answer and distractor [n]: the final norm, then two unembedding columns."""
    norm = getattr(model, "ln_final", None)
    y = (norm(resid) if norm is not None else resid).float()
    u = (model.W_U[:, answer] - model.W_U[:, distractor]).T.float()
    return (y * u).sum(-1) + (model.b_U[answer] - model.b_U[distractor]).float()


def final_norm(model) -> tuple[bool, torch.Tensor | None, torch.Tensor | None, float] | None:
    """TransformerLens's final norm as (centred, weight, bias, eps), None without one: a
    LayerNorm centres its input, then every kind divides by sqrt(mean square + eps) and applies
    its weight and bias, where it has them."""
    from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre

    norm = getattr(model, "ln_final", None)
    if norm is None:
        return None
    if not isinstance(norm, LayerNorm | LayerNormPre | RMSNorm | RMSNormPre):
        raise TypeError(f"final norm {type(norm).__name__}: exact direct effects know LN and RMS")
    centred = isinstance(norm, LayerNorm | LayerNormPre)
    return centred, getattr(norm, "w", None), getattr(norm, "b", None), float(norm.eps)


def feature_fix(model, x, g, answer, distractor, delta, w_dec) -> torch.Tensor:
    """For every prompt and feature at once [b, F]: m(x) - m(x + w) + g . w, the write
    w = delta[b, f] W_dec[f] (delta: the feature's corrupted - clean at the last position,
    x: the clean final residual [b, d], g: the fast method's gradient there).

    The final norm's input x + delta W_dec[f] moves along one direction per feature, so its
    mean square and the metric's numerator are quadratic and linear in delta: three products
    [b, d] x [d, F] give every pair without forming a residual each, in fixed shapes (a
    feature that does not move, delta = 0, gets exactly 0). Float32 matmuls without TF32:
    the correction is meant exact."""
    norm = final_norm(model)
    centred, weight, bias, eps = norm if norm is not None else (False, None, None, 0.0)
    x, g, v = x.float(), g.float(), w_dec.float()
    vc = v - v.mean(-1, keepdim=True) if centred else v
    if centred:
        x = x - x.mean(-1, keepdim=True)
    u = (model.W_U[:, answer] - model.W_U[:, distractor]).T.float()  # [b, d]
    const = (model.b_U[answer] - model.b_U[distractor]).float()[:, None]
    wu = u * weight.float() if weight is not None else u
    if bias is not None:
        const = const + (u @ bias.float())[:, None]
    with precise_math():
        cross, along, grad = x @ vc.T, wu @ vc.T, g @ v.T  # [b, F] each
    dot, square = (wu * x).sum(-1, keepdim=True), (x * x).sum(-1, keepdim=True)  # [b, 1]
    norms = (vc * vc).sum(-1)  # [F]
    d_model = x.shape[-1]

    def metric(step: torch.Tensor) -> torch.Tensor:
        top = dot + step * along
        if norm is None:
            return top + const
        mean_square = (square + 2 * step * cross + step * step * norms) / d_model
        return top / torch.sqrt(mean_square + eps) + const

    delta = delta.float()
    return metric(torch.zeros_like(delta)) - metric(delta) + delta * grad


def writes(sp: Spliced, key: str, group: HookGroup, last: torch.Tensor) -> torch.Tensor:
    """What patching each node of `key` writes into the residual at the last position, given
    the node tensor's change there `last` (corrupted - clean, [b, ...]): [b, nodes, d], heads
    through their W_O, one node for the embedding, an MLP's output or an SAE's error."""
    if group.kind == "attn":  # [b, head, d_head]
        w_o = sp.model.blocks[group.layer].attn.W_O
        return torch.einsum("bhe,hed->bhd", last, w_o.to(last.dtype))
    return last[:, None]


@torch.no_grad()
def with_exact_direct(sp: Spliced, batch, scores: dict, clean: dict, corr: dict, final, grad):
    """`scores` (per key, [b, n_nodes]) with each node's direct part made exact: plus
    m(x) - m(x + w) + g . w for each node's write w, with x the clean final residual and g the
    fast method's gradient there (`final`, `grad` [b, p, d]), at the last position: features
    by feature_fix, other nodes (writes) by the final norm itself. Fixed shapes throughout, no
    data-dependent indexing: nothing is read back to the host."""
    x, g = final[:, -1], grad[:, -1]
    base = final_metric(sp.model, x, batch.answer, batch.distractor)[:, None]
    group_of = sp.group_of
    out = {}
    for key, values in scores.items():
        last = corr[key][:, -1] - clean[key][:, -1]
        group = group_of[key]
        if key.endswith(":feats"):  # [b, d_sae]
            w_dec = sp.saes[group.hook].W_dec
            out[key] = values + feature_fix(
                sp.model, x, g, batch.answer, batch.distractor, last, w_dec
            )
            continue
        w = writes(sp, key, group, last)  # [b, n, d]
        b, n = w.shape[:2]
        moved = final_metric(
            sp.model,
            (x[:, None] + w).reshape(b * n, -1),
            batch.answer[:, None].expand(b, n).reshape(-1),
            batch.distractor[:, None].expand(b, n).reshape(-1),
        ).view(b, n)
        linear = -(g[:, None].float() * w.float()).sum(-1)
        out[key] = values + (base - moved - linear)
    return out
