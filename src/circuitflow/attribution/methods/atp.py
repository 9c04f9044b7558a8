"""`atp`, attribution patching: a node's score is g . (a_clean - a_corrupted), with g = dm/da
the gradient on the clean run; one forward and backward per batch scores every node of every
layer. The graph's edges take the same clean-run gradient (returned with the scores)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from circuitflow.attribution.methods.base import Method

# torch and the spliced model are imported where a batch is scored: the registry's records (their
# `passes` and `memory_factor`) are what attribution/plan.py plans with, in every Snakemake
# invocation, which must not import torch or pandas.
if TYPE_CHECKING:
    import torch

    from circuitflow.attribution.splice import Batch, Spliced


def atp_batch(sp: Spliced, batch: Batch, corr: dict[str, torch.Tensor], exact_direct: bool = True):
    """Attribution patching on one batch: per key, per-prompt node scores [b, n]; also the clean
    metric [b], the clean activations (detached) and dm/da per key (the graph's edges reuse
    it). `exact_direct`: each node's direct part computed exactly (direct.py) instead of
    linearly."""
    import torch

    from circuitflow.attribution import direct
    from circuitflow.attribution.splice import logit_diff, reduce_nodes

    with torch.enable_grad():
        run = sp.run(batch.clean)
        metric = logit_diff(run.logits, batch.answer, batch.distractor)
        keys = list(run.acts)
        inputs = [run.acts[k] for k in keys] + [run.final]
        *grads, g_final = sp.grad(metric.sum(), inputs, len(metric), allow_unused=True)
    clean = {k: v.detach() for k, v in run.acts.items()}
    group_of = sp.group_of
    out, gradients = {}, {}
    for k, grad in zip(keys, grads, strict=True):
        grad = torch.zeros_like(clean[k]) if grad is None else grad.detach()
        out[k] = reduce_nodes(k, group_of[k], (grad * (clean[k] - corr[k])).float())
        gradients[k] = grad
    if exact_direct:
        out = direct.with_exact_direct(sp, batch, out, clean, corr, run.final.detach(), g_final)
    return out, metric.detach(), clean, gradients


def score_batch(sp: Spliced, batch: Batch, corr: dict[str, torch.Tensor], cfg):
    """Method.score_batch: atp_batch, direct effects exact."""
    return atp_batch(sp, batch, corr)


def passes(cfg) -> float:
    """One clean forward and its backward."""
    return 3.0


METHOD = Method(
    name="atp",
    score_batch=score_batch,
    passes=passes,
    memory_factor=1.0,
    description="attribution patching: the clean run's gradient x (clean - corrupted)",
)
