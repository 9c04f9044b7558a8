"""Node attribution: what drives a behaviour's metric (logit difference, answer - distractor, at
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

SAEs are spliced with their error terms: out = decode(encode(x)) + (x - decode(encode(x))), so the
spliced model reproduces the clean logits exactly. We splice with our own hook rather than
`HookedSAETransformer.add_sae(use_error_term=True)` because SAELens computes the error under
`no_grad`: gradients to everything upstream of the SAE would then pass only through the
reconstruction (d out/dx = J_sae instead of I) and the error node would get none. Both splices
give the same feature activations and logits (tested).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

log = logging.getLogger(__name__)

EMBED = "hook_embed"
METHODS = ("atp", "ig")


@dataclass(frozen=True)
class AttributionConfig:
    """The `attribution:` config section (see workflow/schemas/config.schema.yaml)."""

    method: str = "ig"  # fast method for every node: atp | ig
    ig_steps: int = 10
    exact_heads: str | bool = "auto"  # auto: exact patching when the model has <= 512 heads
    exact_features: int = 16  # top features per SAE (by fast score) also patched exactly
    batch_size: int = 64
    max_prompts: int | None = None
    spearman_threshold: float = 0.8
    node_threshold: float = 0.8  # cumulative |score| share of nodes kept in the graph
    edge_threshold: float = 0.98  # cumulative |weight| share of edges kept
    max_graph_nodes: int = 40
    edges: str = "adjacent"  # adjacent (same and previous layer) | all (every earlier node)
    context_features: int = 8  # top features per SAE that get activating contexts
    n_contexts: int = 8
    context_window: int = 8
    context_max_tokens: int = 262144
    top_features_plot: int = 10

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AttributionConfig:
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"attribution: unknown keys {sorted(unknown)}")
        cfg = cls(**d)
        if cfg.method not in METHODS:
            raise ValueError(f"attribution.method: {cfg.method!r}; allowed values: atp, ig")
        return cfg


# --- hook points ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """One hook point whose activation holds one or more nodes."""

    name: str  # hook name, or "<sae hook>.sae" for a spliced SAE (features + error)
    kind: str  # embedding | attn | mlp | sae
    layer: int  # -1 for the embedding
    order: float  # position in the forward pass, for upstream/downstream ordering
    site: str | None = None


SITE_ORDER = {
    "resid_pre": 0.0,
    "attn_out": 0.4,
    "resid_mid": 0.5,
    "mlp_out": 0.9,
    "resid_post": 1.0,
}


def sae_hook(site: str, layer: int) -> str:
    return f"blocks.{layer}.hook_{site}"


def sae_site_layer(hook: str) -> tuple[str, int]:
    """(site, layer) of an SAE hook `blocks.{layer}.hook_{site}` (the inverse of sae_hook)."""
    _, layer, name = hook.split(".", 2)
    return name.removeprefix("hook_"), int(layer)


def build_groups(n_layers: int, sae_keys: list[tuple[str, int]]) -> list[Group]:
    groups = [Group(EMBED, "embedding", -1, -1.0)]
    for layer in range(n_layers):
        groups.append(Group(f"blocks.{layer}.attn.hook_z", "attn", layer, layer + 0.3))
        groups.append(Group(f"blocks.{layer}.hook_mlp_out", "mlp", layer, layer + 0.8))
    for site, layer in sae_keys:
        # An SAE sits on the hook it reads; resid_pre of layer l comes before layer l's heads.
        groups.append(
            Group(
                sae_hook(site, layer) + ".sae", "sae", layer, layer + SITE_ORDER[site] + 0.05, site
            )
        )
    return sorted(groups, key=lambda g: g.order)


# --- the patchable forward --------------------------------------------------------------------
Patch = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Run:
    """Activations of one forward pass: per group, the tensor that flowed on (in the graph when
    gradients are on). SAE groups store `feats` [b, p, d_sae] and `error` [b, p, d]."""

    acts: dict[str, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None


def _sae_hook_fn(sae, key: str, run: Run, patches: dict[str, Patch]):
    def fn(x: torch.Tensor, hook: Any) -> torch.Tensor:
        xin = x.to(sae.dtype)
        feats = sae.encode(xin)
        # The error term keeps its gradient (x - x_hat), so d out / dx = I as in the model itself.
        error = (xin - sae.decode(feats)).to(x.dtype)
        if key + ":feats" in patches:
            feats = patches[key + ":feats"](feats)
        if key + ":error" in patches:
            error = patches[key + ":error"](error)
        run.acts[key + ":feats"] = feats
        run.acts[key + ":error"] = error
        return sae.decode(feats).to(x.dtype) + error

    return fn


def _plain_hook_fn(key: str, run: Run, patches: dict[str, Patch], leaf: bool):
    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
        if leaf and torch.is_grad_enabled():
            act = act.detach().requires_grad_(True)  # the graph's root: parameters are frozen
        if key in patches:
            act = patches[key](act)
        run.acts[key] = act
        return act

    return fn


def forward(
    model,
    tokens: torch.Tensor,
    groups: list[Group],
    saes: dict[str, Any],
    patches: dict[str, Patch] | None = None,
) -> Run:
    """Run the model with every SAE spliced in (error term kept), recording each group's
    activation and applying `patches` (key -> function of the activation). Keys: the hook name
    for plain groups, `<group>:feats` / `<group>:error` for SAE groups."""
    patches = patches or {}
    run = Run()
    hooks = []
    for g in groups:
        if g.kind == "sae":
            hook = g.name.removesuffix(".sae")
            hooks.append((hook, _sae_hook_fn(saes[hook], g.name, run, patches)))
        else:
            hooks.append((g.name, _plain_hook_fn(g.name, run, patches, leaf=g.kind == "embedding")))
    with model.hooks(fwd_hooks=hooks):
        run.logits = model(tokens, return_type="logits")
    return run


def logit_diff(
    logits: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor
) -> torch.Tensor:
    """Per-prompt metric [b]: answer minus distractor logit at the last position."""
    last = logits[:, -1].float()
    rows = torch.arange(len(answer), device=last.device)
    return last[rows, answer] - last[rows, distractor]


# --- node tables ------------------------------------------------------------------------------
def reduce_nodes(key: str, group: Group, t: torch.Tensor) -> torch.Tensor:
    """Sum a per-element product [b, p, ...] over prompts' positions into per-node values
    [b, n_nodes]: heads for hook_z, features for SAE feats, one node otherwise."""
    if group.kind == "attn":
        return t.sum(dim=(1, 3))
    if key.endswith(":feats"):
        return t.sum(dim=1)
    return t.flatten(1).sum(dim=1, keepdim=True)


def group_keys(g: Group) -> list[str]:
    return [g.name + ":feats", g.name + ":error"] if g.kind == "sae" else [g.name]


@dataclass
class Batch:
    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: torch.Tensor
    distractor: torch.Tensor


def iter_batches(prompts: pd.DataFrame, batch_size: int, device) -> Iterator[Batch]:
    """Prompts of equal length batched together (no padding)."""
    by_len: dict[int, list[int]] = {}
    for i, toks in enumerate(prompts["clean_tokens"]):
        by_len.setdefault(len(toks), []).append(i)
    for idx in by_len.values():
        for s in range(0, len(idx), batch_size):
            rows = prompts.iloc[idx[s : s + batch_size]]

            def stack(col: str, rows: pd.DataFrame = rows) -> torch.Tensor:
                return torch.tensor(np.stack(rows[col].to_list()), device=device, dtype=torch.long)

            yield Batch(
                stack("clean_tokens"),
                stack("corrupted_tokens"),
                torch.tensor(rows["answer_id"].to_numpy(), device=device, dtype=torch.long),
                torch.tensor(rows["distractor_id"].to_numpy(), device=device, dtype=torch.long),
            )


@torch.no_grad()
def corrupted_acts(model, batch: Batch, groups, saes) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in forward(model, batch.corrupted, groups, saes).acts.items()}


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


def _ig_heads(model, batch: Batch, groups, saes, g: Group, corr, clean, alphas) -> torch.Tensor:
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


def _node_patch(key: str, group: Group, index: int, corr: torch.Tensor) -> Patch:
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


# --- the whole attribution --------------------------------------------------------------------
@dataclass
class NodeScores:
    """Mean scores per node, by method: frame with key, kind, layer, index, site, score_* ."""

    frame: pd.DataFrame
    groups: list[Group]
    metric_clean: float
    metric_corrupted: float
    seconds: dict[str, float]
    n_prompts: int


def node_frame(groups: list[Group], fast: dict[str, np.ndarray], method: str) -> pd.DataFrame:
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
    import time

    for p in model.parameters():
        p.requires_grad_(False)
    device = next(model.parameters()).device
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    keys = sorted((sae_site_layer(h) for h in saes), key=lambda k: (k[1], k[0]))
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


# --- memory -----------------------------------------------------------------------------------
def plan_batch_size(model, prompts: pd.DataFrame, saes: dict[str, Any], cfg: AttributionConfig):
    """The memory plan's batch size (prompts), at most `cfg.batch_size`: the gradient passes hold
    every layer's activations and every SAE's features, and integrated gradients for heads runs
    n_heads copies of the batch, so a batch that fits a small model can exceed a GPU on a real
    one. Batching changes no score (each is a mean over prompts). Returns memory.BatchPlan."""
    from circuitflow import memory

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


# --- SAEs -------------------------------------------------------------------------------------
def load_saes(sae_dirs: list[Path | str], device) -> dict[str, Any]:
    """hook name -> SAE (eval mode, on `device`), from SAELens directories."""
    from sae_lens import SAE

    saes = {}
    for d in sae_dirs:
        sae = SAE.load_from_disk(str(d), device=str(device)).eval()
        hook = sae.cfg.metadata.hook_name
        if not hook:
            raise ValueError(f"{d}: SAE has no metadata.hook_name")
        for p in sae.parameters():
            p.requires_grad_(False)
        saes[hook] = sae
    return saes


@contextmanager
def sae_lens_spliced(model, saes: dict[str, Any]):
    """The model as a HookedSAETransformer with every SAE attached through SAELens, error terms
    on: used to check that our splice and SAELens's agree."""
    from circuitflow.sae_metrics import as_hooked_sae_transformer

    hooked = as_hooked_sae_transformer(model)
    for sae in saes.values():
        hooked.add_sae(sae, use_error_term=True)
    try:
        yield hooked
    finally:
        hooked.reset_saes()
