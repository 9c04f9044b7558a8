"""`ig`, integrated gradients along the activation path (IG-activations of Marks et al. 2024 and
Hanna et al. 2024): every node moves from its clean to its corrupted value on a straight line in
`ig_steps` steps (midpoints); each node's gradient, taken with every node at the same point of
its line, is averaged along the way and dotted with its (a_clean - a_corrupted). One forward and
backward per step, after a clean forward, scores every node of every layer; the graph's edges
take the same averaged gradient (returned with the scores). The steps run one after another,
so the peak memory is one step's (the gradient pass of atp)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from circuitflow.attribution.methods.base import Method

# torch and the spliced model are imported where a batch is scored: the registry's records (their
# `passes` and `memory_factor`) are what attribution/plan.py plans with, in every Snakemake
# invocation, which must not import torch or pandas.
if TYPE_CHECKING:
    import torch

    from circuitflow.attribution.splice import Batch, Patch, Spliced

FINAL = "final"  # path_gradients' key for the final residual's gradient


def interpolate(clean: torch.Tensor, corr: torch.Tensor, alpha: float) -> Patch:
    """A patch that sets a node tensor to clean + alpha (corrupted - clean). The value is
    replaced but the gradient passes through as through the identity, so each node's gradient
    is the one at the point where every node sits on its line."""

    def patch(act: torch.Tensor) -> torch.Tensor:
        return act + (clean + alpha * (corr - clean) - act).detach()

    return patch


def path_gradients(sp: Spliced, batch: Batch, keys: list[str], clean, corr, steps: int):
    """dm/da for each of `keys`, averaged over `steps` midpoints of the activation path (every
    node of every layer on its clean-to-corrupted line, one forward and backward per step); under
    the key `FINAL`, the same for the final residual (Run.final)."""
    import torch

    from circuitflow.attribution.splice import logit_diff

    total = {k: torch.zeros_like(clean[k]) for k in keys}
    for i in range(steps):
        alpha = (i + 0.5) / steps
        patches = {k: interpolate(clean[k], corr[k], alpha) for k in clean}
        with torch.enable_grad():
            run = sp.run(batch.clean, patches)
            metric = logit_diff(run.logits, batch.answer, batch.distractor)
            inputs = [run.acts[k] for k in keys] + [run.final]
            grads = sp.grad(metric.sum(), inputs, len(metric), allow_unused=True)
        for k, grad in zip([*keys, FINAL], grads, strict=True):
            if grad is not None:
                total[k] = total.get(k, 0) + grad.detach()
    return {k: v / steps for k, v in total.items()}


def ig_batch(sp: Spliced, batch: Batch, clean, corr, final, steps: int, exact_direct: bool = True):
    """Integrated gradients along the activation path: (per key, per-prompt node scores [b, n];
    per key, dm/da averaged along the path), one forward and backward per step for every node
    of every layer. `final`: the clean final residual; `exact_direct`: each node's direct part
    computed exactly (direct.py)."""
    from circuitflow.attribution import direct
    from circuitflow.attribution.splice import reduce_nodes

    grads = path_gradients(sp, batch, list(clean), clean, corr, steps)
    g_final = grads.pop(FINAL)
    group_of = sp.group_of
    out = {
        k: reduce_nodes(k, group_of[k], (g * (clean[k] - corr[k])).float())
        for k, g in grads.items()
    }
    if exact_direct:
        out = direct.with_exact_direct(sp, batch, out, clean, corr, final, g_final)
    return out, grads


def clean_forward(sp: Spliced, batch: Batch):
    """(every node's clean activation, detached; the clean metric; the clean final residual),
    from one forward without gradients: the start of the path."""
    import torch

    from circuitflow.attribution.splice import logit_diff

    with torch.no_grad():
        run = sp.run(batch.clean)
    clean = {k: v.detach() for k, v in run.acts.items()}
    return clean, logit_diff(run.logits, batch.answer, batch.distractor), run.final


def score_batch(sp: Spliced, batch: Batch, corr: dict[str, torch.Tensor], cfg):
    """Method.score_batch: a clean forward, then ig_batch with `cfg.ig_steps` steps, direct
    effects exact."""
    clean, metric, final = clean_forward(sp, batch)
    scores, grads = ig_batch(sp, batch, clean, corr, final, cfg.ig_steps)
    return scores, metric, clean, grads


def passes(cfg) -> float:
    """A clean forward, then one forward and backward per step."""
    return 1.0 + 3.0 * cfg.ig_steps


METHOD = Method(
    name="ig",
    score_batch=score_batch,
    passes=passes,
    memory_factor=1.0,
    description="integrated gradients along the activation path, in ig_steps steps",
)
