"""Node scores: what drives a behaviour's metric (logit difference, answer - distractor, at
the last position).

Nodes: the token embedding, every attention head (through `hook_z`), every MLP output, and every
SAE feature plus the SAE's error term at each trained (site, layer). A node's score is the effect
of patching it from the corrupted run into the clean run, signed so that positive means the node
supports the answer:  score = m(clean) - m(clean with node <- corrupted), averaged over prompts.

Methods:
* `atp` (attribution patching): g . (a_clean - a_corrupted), g = dm/da on the clean run; one
  forward/backward pair per batch for every node at once.
* `ig` (integrated gradients along the clean -> corrupted path, as Marks et al. 2024): for each
  hook point separately, its activation is set to a_clean + alpha (a_corr - a_clean) at `steps`
  midpoints alpha, gradients are averaged and dotted with (a_clean - a_corr).
* `exact` (activation patching): one forward per node; the reference the fast methods are
  validated against.

The spliced forward pass the methods run is in `splice.py`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow import memory
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.splice import (
    Batch,
    HookGroup,
    Patch,
    build_groups,
    corrupted_acts,
    forward,
    group_keys,
    iter_batches,
    logit_diff,
    reduce_nodes,
)
from circuitflow.nodes import site_layer

log = logging.getLogger(__name__)


def atp_batch(model, batch: Batch, groups, saes, corr: dict[str, torch.Tensor]):
    """Attribution patching on one batch: per key, per-prompt node scores [b, n]; also the clean
    metric [b] and the clean activations (detached)."""
    with torch.enable_grad():
        run = forward(model, batch.clean, groups, saes)
        metric = logit_diff(run.logits, batch.answer, batch.distractor)
        keys = list(run.acts)
        grads = torch.autograd.grad(metric.sum(), [run.acts[k] for k in keys], allow_unused=True)
    by_key = {g: grp for grp in groups for g in group_keys(grp)}
    out = {}
    for k, grad in zip(keys, grads, strict=True):
        clean = run.acts[k].detach()
        if grad is None:
            grad = torch.zeros_like(clean)
        out[k] = reduce_nodes(k, by_key[k], (grad * (clean - corr[k])).float()).detach()
    return out, metric.detach(), {k: v.detach() for k, v in run.acts.items()}


def ig_batch(model, batch: Batch, groups, saes, corr, clean, steps: int):
    """Integrated gradients per hook point: interpolate that group's activation(s) from clean to
    corrupted at midpoints, average the gradients there, dot with (clean - corrupted)."""
    out = {}
    alphas = [(i + 0.5) / steps for i in range(steps)]
    for g in groups:
        if g.kind == "attn":
            out[g.name] = _ig_heads(model, batch, groups, saes, g, corr, clean, alphas)
            continue
        keys = group_keys(g)
        grad_sum = {k: torch.zeros_like(clean[k]) for k in keys}
        for alpha in alphas:
            patches = {}
            for k in keys:

                def patch(act, k=k, alpha=alpha):
                    # Replace, keeping the tensor in the graph so its gradient is defined.
                    value = clean[k] + alpha * (corr[k] - clean[k])
                    return act + (value - act).detach()

                patches[k] = patch
            with torch.enable_grad():
                run = forward(model, batch.clean, groups, saes, patches)
                metric = logit_diff(run.logits, batch.answer, batch.distractor)
                grads = torch.autograd.grad(
                    metric.sum(), [run.acts[k] for k in keys], allow_unused=True
                )
            for k, grad in zip(keys, grads, strict=True):
                if grad is not None:
                    grad_sum[k] += grad.detach()
        for k in keys:
            out[k] = reduce_nodes(k, g, (grad_sum[k] / steps * (clean[k] - corr[k])).float())
    return out


def _ig_heads(model, batch: Batch, groups, saes, g: HookGroup, corr, clean, alphas) -> torch.Tensor:
    """IG for heads, one head at a time: copy h of the batch interpolates head h only. Heads of
    one layer interact (induction needs the previous-token head AND the induction head), so
    moving a whole layer's heads together splits credit in ways single-head patching does not."""
    k = g.name
    n_heads = clean[k].shape[2]
    b = clean[k].shape[0]
    onehot = torch.eye(n_heads, dtype=clean[k].dtype, device=clean[k].device)
    mask = onehot[:, None, None, :, None]  # [copy, 1, 1, head, 1]
    c, d = clean[k].unsqueeze(0), (corr[k] - clean[k]).unsqueeze(0)
    tokens = batch.clean.repeat(n_heads, 1)
    answer, distractor = batch.answer.repeat(n_heads), batch.distractor.repeat(n_heads)
    grad_sum = torch.zeros(n_heads, *clean[k].shape, dtype=clean[k].dtype, device=c.device)
    for alpha in alphas:
        value = (c + alpha * mask * d).flatten(0, 1)

        def patch(act, value=value):
            return act + (value - act).detach()

        with torch.enable_grad():
            run = forward(model, tokens, groups, saes, {k: patch})
            metric = logit_diff(run.logits, answer, distractor)
            (grad,) = torch.autograd.grad(metric.sum(), [run.acts[k]])
        grad_sum += grad.detach().view(n_heads, b, *clean[k].shape[1:])
    per_copy = (grad_sum / len(alphas) * -d).float()  # (clean - corr) = -d
    # Copy h scores head h: [copy, b, p, head, d_head] -> [b, head].
    per_head = per_copy.sum(dim=(2, 4))  # [copy, b, head]
    return torch.diagonal(per_head, dim1=0, dim2=2)  # [b, head]


def _node_patch(key: str, group: HookGroup, index: int, corr: torch.Tensor) -> Patch:
    def patch(act: torch.Tensor) -> torch.Tensor:
        if group.kind == "attn":  # [b, p, head, d_head]
            act = act.clone()
            act[:, :, index] = corr[:, :, index]
            return act
        if key.endswith(":feats"):  # [b, p, d_sae]
            act = act.clone()
            act[..., index] = corr[..., index]
            return act
        return corr.clone()

    return patch


@torch.no_grad()
def exact_batch(model, batch, groups, saes, corr, nodes: list[tuple[str, int]]):
    """Activation patching: one forward per node; per node, the per-prompt drop in the metric."""
    by_key = {k: grp for grp in groups for k in group_keys(grp)}
    base = logit_diff(
        forward(model, batch.clean, groups, saes).logits, batch.answer, batch.distractor
    )
    out = {}
    for key, index in nodes:
        patch = _node_patch(key, by_key[key], index, corr[key])
        run = forward(model, batch.clean, groups, saes, {key: patch})
        out[(key, index)] = (base - logit_diff(run.logits, batch.answer, batch.distractor)).float()
    return out


# --- the whole attribution ------------------------------------------------------------------------
@dataclass
class NodeScores:
    """Mean scores per node, by method: frame with key, kind, layer, index, site, score_* ."""

    frame: pd.DataFrame
    groups: list[HookGroup]
    metric_clean: float
    metric_corrupted: float
    seconds: dict[str, float]
    n_prompts: int


def node_frame(groups: list[HookGroup], fast: dict[str, np.ndarray], method: str) -> pd.DataFrame:
    rows = []
    for g in groups:
        for key in group_keys(g):
            values = fast[key]
            for i, v in enumerate(values):
                if g.kind == "attn":
                    kind, index = "head", i
                elif g.kind == "sae":
                    kind, index = ("feature", i) if key.endswith(":feats") else ("error", -1)
                else:
                    kind, index = g.kind, -1
                rows.append(
                    {
                        "key": key,
                        "kind": kind,
                        "layer": g.layer,
                        "index": index,
                        "site": g.site,
                        "order": g.order,
                        f"score_{method}": float(v),
                    }
                )
    return pd.DataFrame(rows)


def attribute(
    model,
    prompts: pd.DataFrame,
    saes: dict[str, Any],
    cfg: AttributionConfig,
) -> NodeScores:
    """Score every node with the fast method, and the exact reference where configured."""

    for p in model.parameters():
        p.requires_grad_(False)
    device = next(model.parameters()).device
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    keys = sorted((site_layer(h) for h in saes), key=lambda k: (k[1], k[0]))
    groups = build_groups(model.cfg.n_layers, keys)
    sums: dict[str, torch.Tensor] = {}
    m_clean = m_corr = 0.0
    n = 0
    t0 = time.perf_counter()
    batches = list(iter_batches(prompts, cfg.batch_size, device))
    cache = []
    for batch in batches:
        corr = corrupted_acts(model, batch, groups, saes)
        atp, metric, clean = atp_batch(model, batch, groups, saes, corr)
        scores = (
            atp
            if cfg.method == "atp"
            else ig_batch(model, batch, groups, saes, corr, clean, cfg.ig_steps)
        )
        for k, v in scores.items():
            sums[k] = sums.get(k, 0) + v.sum(0)
        with torch.no_grad():
            mc = logit_diff(
                forward(model, batch.corrupted, groups, saes).logits, batch.answer, batch.distractor
            )
        m_clean += metric.sum().item()
        m_corr += mc.sum().item()
        n += len(metric)
        cache.append(batch)
    t_fast = time.perf_counter() - t0
    fast = {k: (v / n).cpu().numpy() for k, v in sums.items()}
    frame = node_frame(groups, fast, cfg.method)

    exact_nodes = exact_node_list(frame, model.cfg, cfg)
    t0 = time.perf_counter()
    exact_sum: dict[tuple[str, int], float] = {}
    if exact_nodes:
        for batch in cache:
            corr = corrupted_acts(model, batch, groups, saes)
            for node, v in exact_batch(model, batch, groups, saes, corr, exact_nodes).items():
                exact_sum[node] = exact_sum.get(node, 0.0) + v.sum().item()
    t_exact = time.perf_counter() - t0
    idx = {
        (k, i): j for j, (k, i) in enumerate(zip(frame["key"], _patch_index(frame), strict=True))
    }
    exact = np.full(len(frame), np.nan)
    for node, total in exact_sum.items():
        exact[idx[node]] = total / n
    frame["score_exact"] = exact
    return NodeScores(
        frame,
        groups,
        m_clean / n,
        m_corr / n,
        {"fast": t_fast, "exact": t_exact},
        n,
    )


def _patch_index(frame: pd.DataFrame) -> list[int]:
    """Index used when patching: head / feature index, 0 for single-node groups."""
    return [int(i) if i >= 0 else 0 for i in frame["index"]]


def exact_node_list(
    frame: pd.DataFrame, model_cfg, cfg: AttributionConfig
) -> list[tuple[str, int]]:
    nodes: list[tuple[str, int]] = []
    heads = model_cfg.n_layers * model_cfg.n_heads
    do_heads = cfg.exact_heads is True or (cfg.exact_heads == "auto" and heads <= 512)
    fast_col = f"score_{cfg.method}"
    for row in frame.itertuples():
        if row.kind in ("head", "mlp", "embedding") and do_heads:
            nodes.append((row.key, max(int(row.index), 0)))
        elif row.kind == "error" and cfg.exact_features > 0:
            nodes.append((row.key, 0))
    if cfg.exact_features > 0:
        feats = frame[frame["kind"] == "feature"].copy()
        feats["abs"] = feats[fast_col].abs()
        for _, sub in feats.groupby("key"):
            for row in sub.nlargest(cfg.exact_features, "abs").itertuples():
                nodes.append((row.key, int(row.index)))
    return nodes


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    from scipy.stats import spearmanr

    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 3:
        return None
    rho = spearmanr(a[ok], b[ok]).statistic
    return None if math.isnan(rho) else float(rho)


def validation(frame: pd.DataFrame, method: str, threshold: float) -> dict[str, Any]:
    """Rank agreement of the fast method with exact patching, on nodes where both exist."""
    fast, exact = frame[f"score_{method}"].to_numpy(), frame["score_exact"].to_numpy()
    both = ~np.isnan(exact)
    rho = spearman(fast, exact)
    return {
        "method": method,
        "reference": "exact",
        "n_nodes": int(both.sum()),
        "spearman": rho,
        "threshold": threshold,
        "passed": None if rho is None else bool(rho >= threshold),
        "kinds": sorted(frame.loc[both, "kind"].unique().tolist()),
    }


def with_score(frame: pd.DataFrame, method: str) -> pd.DataFrame:
    """`score`: exact where computed (the reference), else the fast method; `score_source` says
    which."""
    frame = frame.copy()
    exact = frame["score_exact"]
    frame["score"] = exact.where(exact.notna(), frame[f"score_{method}"])
    frame["score_source"] = np.where(exact.notna(), "exact", method)
    return frame


def heads_table(frame: pd.DataFrame) -> pd.DataFrame:
    heads = frame[frame["kind"] == "head"].rename(columns={"index": "head"})
    cols = ["layer", "head", "score", *[c for c in heads if c.startswith("score_")]]
    heads = heads[cols].sort_values("score", key=np.abs, ascending=False)
    heads["rank"] = np.arange(1, len(heads) + 1)
    return heads.reset_index(drop=True)


def features_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Features and each SAE's error node (feature = -1, kind = error)."""
    feats = frame[frame["kind"].isin(["feature", "error"])].rename(columns={"index": "feature"})
    cols = [
        "site",
        "layer",
        "feature",
        "kind",
        "score",
        *[c for c in feats if c.startswith("score_")],
    ]
    feats = feats[cols].sort_values("score", key=np.abs, ascending=False)
    feats["rank"] = np.arange(1, len(feats) + 1)
    return feats.reset_index(drop=True)


def components_table(frame: pd.DataFrame) -> pd.DataFrame:
    comp = frame[frame["kind"].isin(["embedding", "head", "mlp"])]
    cols = ["kind", "layer", "index", "score", *[c for c in comp if c.startswith("score_")]]
    return comp[cols].sort_values("score", key=np.abs, ascending=False).reset_index(drop=True)


# --- memory ---------------------------------------------------------------------------------------
def plan_batch_size(model, prompts: pd.DataFrame, saes: dict[str, Any], cfg: AttributionConfig):
    """The memory plan's batch size (prompts), at most `cfg.batch_size`: the gradient passes hold
    every layer's activations and every SAE's features, and integrated gradients for heads runs
    n_heads copies of the batch, so a batch that fits a small model can exceed a GPU on a real
    one. Batching changes no score (each is a mean over prompts). Returns memory.BatchPlan."""
    params = list(model.parameters())
    device = str(params[0].device)
    length = max((len(t) for t in prompts["clean_tokens"]), default=1)
    d_sae = max((sae.cfg.d_sae for sae in saes.values()), default=0)
    estimate = memory.estimate_attribution(
        model.cfg, sum(p.numel() for p in params), length, len(saes), d_sae, params[0].dtype,
        device, cfg.method,
    )  # fmt: skip
    loaded = estimate.weights  # the model and SAEs are on the device already
    return memory.plan_batch_size(
        estimate, cfg.batch_size, available=memory.available_bytes(device) + loaded
    )
