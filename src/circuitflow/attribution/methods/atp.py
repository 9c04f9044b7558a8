"""`atp`, attribution patching: a node's score is g . (a_clean - a_corrupted), with g = dm/da
the gradient on the clean run; one forward and backward per batch scores every node of every
layer. The graph's edges take the same clean-run gradient."""

from __future__ import annotations

import torch

from circuitflow.attribution import direct
from circuitflow.attribution.methods.base import Method
from circuitflow.attribution.splice import Batch, Spliced, logit_diff, reduce_nodes


def atp_batch(sp: Spliced, batch: Batch, corr: dict[str, torch.Tensor], exact_direct: bool = True):
    """Attribution patching on one batch: per key, per-prompt node scores [b, n]; also the clean
    metric [b] and the clean activations (detached). `exact_direct`: each node's direct part
    computed exactly (direct.py) instead of linearly."""
    with torch.enable_grad():
        run = sp.run(batch.clean)
        metric = logit_diff(run.logits, batch.answer, batch.distractor)
        keys = list(run.acts)
        inputs = [run.acts[k] for k in keys] + [run.final]
        *grads, g_final = sp.grad(metric.sum(), inputs, len(metric), allow_unused=True)
    clean = {k: v.detach() for k, v in run.acts.items()}
    group_of = sp.group_of
    out = {}
    for k, grad in zip(keys, grads, strict=True):
        grad = torch.zeros_like(clean[k]) if grad is None else grad
        out[k] = reduce_nodes(k, group_of[k], (grad * (clean[k] - corr[k])).float()).detach()
    if exact_direct:
        out = direct.with_exact_direct(sp, batch, out, clean, corr, run.final.detach(), g_final)
    return out, metric.detach(), clean


def score_batch(sp: Spliced, batch: Batch, corr: dict[str, torch.Tensor], cfg):
    """Method.score_batch: atp_batch, direct effects exact."""
    return atp_batch(sp, batch, corr)


def edge_gradients(sp: Spliced, batch: Batch, keys: list[str], corr: dict, cfg):
    """Method.edge_gradients: dm/da on the clean run, whose forward gives the clean values too."""
    with torch.enable_grad():
        run = sp.run(batch.clean)
        metric = logit_diff(run.logits, batch.answer, batch.distractor)
        grads = sp.grad(metric.sum(), [run.acts[k] for k in keys], len(metric))
    clean = {k: v.detach() for k, v in run.acts.items()}
    return dict(zip(keys, (g.detach() for g in grads), strict=True)), clean, metric.detach()


def passes(cfg) -> float:
    """One clean forward and its backward, for the scores and for the edges' gradients alike."""
    return 3.0


METHOD = Method(
    name="atp",
    score_batch=score_batch,
    edge_gradients=edge_gradients,
    passes=passes,
    gradient_passes=passes,
    memory_factor=1.0,
    description="attribution patching: the clean run's gradient x (clean - corrupted)",
)
