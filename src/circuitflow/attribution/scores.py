"""Node scores: what drives a behaviour's metric (logit difference, answer - distractor, at
the last position).

Nodes: the token embedding, every attention head (through `hook_z`), every MLP output, and every
SAE feature plus the SAE's error term at each trained (site, layer). A node's score is the effect
of patching it from the corrupted run into the clean run, signed so that positive means the node
supports the answer:  score = m(clean) - m(clean with node <- corrupted), averaged over prompts.

Methods (every node of every layer from the same passes): the fast ones are records of the
registry in `methods/` (`attribution.method`), which this module runs by their `score_batch`
after the corrupted forward they share:
* `atp` (attribution patching, methods/atp.py): g . (a_clean - a_corrupted), g = dm/da on the
  clean run; one forward/backward per batch.
* `ig` (integrated gradients along the activation path, methods/ig.py): every node moves from
  its clean to its corrupted value in `ig_steps` steps, its gradient averaged along the way and
  dotted with (a_clean - a_corrupted); one forward/backward per step for all nodes. Along the
  input path instead (the embedding moved, the rest recomputed), a TopK feature's activation
  jumps rather than moves, and heads whose effects are ANDed take each other's share: on the
  embedded induction circuit the previous-token head scored -1.0 against an exact 6.6, and head
  and feature rank agreement with exact patching were 0.53 and 0.29 (0.91 and 0.68 along
  activations, at the same cost).
* Both fast methods take each node's direct effect (its write into the last residual, read
  through the final norm) exactly and estimate only the paths through later layers
  (direct.py): a gradient misjudges the final norm when a node writes much of the residual.
* `exact` (activation patching): one forward per node; the reference the fast methods are
  validated against, kind by kind.

Every score is a mean over all prompts (`score_*`) and over the selection half
(`score_*_selection`, batching.selection_half), which interventions ranks circuits by, so the
held-out half stays unseen. The fast method's mean over the validation prompts, where exact
patching runs, is `score_<method>_validation`: `validation` compares like with like (on the
embedded default, scores averaged over all 256 prompts against exact ones over 32 differed by
prompt sampling alone: feature rank agreement 0.82 and 0.89 instead of 0.89 and 0.97).
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
from circuitflow.attribution.plan import estimate_attribution
from circuitflow.attribution.splice import (
    Batch,
    HookGroup,
    Patch,
    Spliced,
    logit_diff,
    run_batches,
)
from circuitflow.batching import by_length, selection_half

log = logging.getLogger(__name__)


def node_patch(key: str, group: HookGroup, index: int, value: torch.Tensor) -> Patch:
    """A patch that sets one node (head `index` of hook_z, feature `index` of an SAE, or the
    whole tensor of a single-node group) to its value in `value`."""

    def patch(act: torch.Tensor) -> torch.Tensor:
        if group.kind == "attn":  # [b, p, head, d_head]
            act = act.clone()
            act[:, :, index] = value[:, :, index]
            return act
        if key.endswith(":feats"):  # [b, p, d_sae]
            act = act.clone()
            act[..., index] = value[..., index]
            return act
        return value.clone()

    return patch


@torch.no_grad()
def exact_batch(sp: Spliced, batch: Batch, corr, nodes: list[tuple[str, int]], base=None):
    """Activation patching: one forward per node; per node, the per-prompt drop in the metric
    from `base`, the clean metric (a clean forward's when None)."""
    group_of = sp.group_of
    if base is None:
        base = logit_diff(sp.run(batch.clean).logits, batch.answer, batch.distractor)
    out = {}
    for key, index in nodes:
        run = sp.run(batch.clean, {key: node_patch(key, group_of[key], index, corr[key])})
        out[(key, index)] = (base - logit_diff(run.logits, batch.answer, batch.distractor)).float()
    return out


# --- the whole attribution ------------------------------------------------------------------------
class Kept:
    """What the score pass computed on the validation prompts and the later steps there need
    again, on the host (a prompt's gradients are every node's activation's size): per prompt
    (the prompt table's index label), dm/da of every key (the method's gradient, which the
    graph's edges are weighted by) and the clean metric (exact patching's base). Reusing them
    spares the edges the method's gradient passes: ig_steps forwards and backwards a prompt.

    They live in one host buffer (pinned on a GPU), a row of bytes a prompt, its slot fixed
    by the order the batches visit the prompts (`order`), so a batch's kept rows are one run of
    slots: each batch packs its rows on the device and copies them there in one copy that does
    not block; reading waits for the last copy once. A batch redone after running out of
    memory writes the same slots again."""

    def __init__(self, prompts: pd.DataFrame, mask: np.ndarray, device) -> None:
        groups = [idx[mask[idx]] for idx in by_length(prompts["clean_tokens"])]
        order = np.concatenate([np.zeros(0, dtype=np.int64), *groups]).astype(np.int64)
        self.labels = list(prompts.index[order])
        self.slot = {label: i for i, label in enumerate(self.labels)}
        self.lengths = np.array([len(prompts["clean_tokens"].iloc[i]) for i in order])
        self.mask, self.index = mask, prompts.index
        self.device = str(device)
        self.layout: list[tuple[str, tuple[int, ...], torch.dtype, int]] = []  # per token
        self.offsets = np.zeros(len(order) + 1, dtype=np.int64)
        self.buffer: torch.Tensor | None = None
        self.copied: torch.cuda.Event | None = None

    def _allocate(self, grads: dict[str, torch.Tensor]) -> None:
        """The layout of a row (per key, its bytes a token; the metric's 4 bytes last) and the
        buffer, from the first batch's tensors."""
        for k, g in grads.items():
            self.layout.append((k, tuple(g.shape[2:]), g.dtype, g[0, 0].numel() * g.itemsize))
        per_token = sum(n for *_, n in self.layout)
        self.offsets[1:] = np.cumsum(self.lengths * per_token + 4)
        pin = self.device.startswith("cuda")
        self.buffer = torch.empty(int(self.offsets[-1]), dtype=torch.uint8, pin_memory=pin)

    def add(self, batch: Batch, grads: dict[str, torch.Tensor], metric: torch.Tensor) -> None:
        """The rows `batch.keep` of `grads` and `metric` ([b, ...] on the device)."""
        n = 0 if batch.keep is None else len(batch.keep)
        if n == 0:
            return
        if self.buffer is None:
            self._allocate(grads)
        labels = self.labels_of(batch)
        first = self.slot[labels[0]]
        assert [self.slot[x] for x in labels] == list(range(first, first + n)), labels
        rows = [grads[k].index_select(0, batch.keep).reshape(n, -1) for k, *_ in self.layout]
        rows.append(metric.float().index_select(0, batch.keep)[:, None])
        packed = torch.cat([r.view(torch.uint8) for r in rows], dim=1)
        start, stop = int(self.offsets[first]), int(self.offsets[first + n])
        self.buffer[start:stop].view(n, -1).copy_(packed, non_blocking=True)
        if self.device.startswith("cuda"):
            self.copied = torch.cuda.Event()
            self.copied.record()

    def labels_of(self, batch: Batch) -> list:
        """The labels of the batch's kept rows, in order."""
        rows = batch.rows[self.mask[batch.rows]]
        return list(self.index[rows])

    def _row(self, label) -> torch.Tensor:
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None
        i = self.slot[label]
        return self.buffer[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def gradients(self, label) -> dict[str, torch.Tensor]:
        """Per key, the prompt's kept gradient [p, ...] (a copy, on the host)."""
        row, p, at, out = self._row(label), int(self.lengths[self.slot[label]]), 0, {}
        for key, shape, dtype, per_token in self.layout:
            out[key] = row[at : at + p * per_token].clone().view(dtype).reshape(p, *shape)
            at += p * per_token
        return out

    def metric(self, label) -> torch.Tensor:
        return self._row(label)[-4:].clone().view(torch.float32)[0]

    def batch_gradients(self, labels, keys, device) -> dict[str, torch.Tensor]:
        """Per key, the kept gradients of `labels`, stacked in that order [b, ...]."""
        grads = [self.gradients(x) for x in labels]
        return {k: torch.stack([g[k] for g in grads]).to(device) for k in keys}

    def batch_metric(self, labels, device) -> torch.Tensor:
        return torch.stack([self.metric(x) for x in labels]).to(device)


@dataclass
class NodeScores:
    """Mean scores per node: frame with key, kind, layer, index, site, order and the
    `score_<method>`, `score_exact` columns, each also over the selection half."""

    frame: pd.DataFrame
    spliced: Spliced
    metric_clean: float
    metric_corrupted: float
    seconds: dict[str, float]
    n_prompts: int
    kept: Kept  # the validation prompts' gradients and clean metrics, which edges reuse

    @property
    def groups(self) -> list[HookGroup]:
        return self.spliced.groups


class Sums:
    """Per-prompt values summed over all prompts and over each subset of them (`subsets`:
    name -> a mask over the prompt table, such as the selection half), on the device in float64:
    a batch carries its rows' membership of each subset (`masks`, Batch.member), so a batch adds
    in one product per key, with nothing read back until the means."""

    def __init__(self, **subsets: np.ndarray):
        self.names = (None, *subsets)
        self.subsets = subsets
        self.sums: dict = {}
        self.shapes: dict = {}
        self.n = dict.fromkeys(self.names, 0)

    def masks(self, n_prompts: int) -> np.ndarray:
        """[1 + subsets, n_prompts]: every prompt, then each subset (make_batch's `masks`)."""
        return np.stack([np.ones(n_prompts, dtype=bool), *self.subsets.values()])

    def add(self, key, values: torch.Tensor, member: torch.Tensor) -> None:
        """`values` [b, ...] for the batch whose Batch.member (made with `masks`) is `member`."""
        total = member.double() @ values.reshape(len(values), -1).double()  # [1 + subsets, n]
        if key in self.sums:
            self.sums[key] += total
        else:
            self.sums[key], self.shapes[key] = total, values.shape[1:]

    def count(self, rows: np.ndarray) -> None:
        for name in self.n:
            self.n[name] += len(rows) if name is None else int(self.subsets[name][rows].sum())

    def means(self, subset: str | None = None) -> dict:
        """Per key, the mean over all prompts (None) or over `subset`."""
        n, row = max(self.n[subset], 1), self.names.index(subset)
        return {k: (v[row] / n).reshape(self.shapes[k]).cpu().numpy() for k, v in self.sums.items()}


def node_frame(groups: list[HookGroup], columns: dict[str, dict[str, np.ndarray]]) -> pd.DataFrame:
    """One row per node; `columns` maps a column name to per-key arrays of node values."""
    rows = []
    for g in groups:
        keys = [g.name + ":feats", g.name + ":error"] if g.kind == "sae" else [g.name]
        for key in keys:
            n = len(next(iter(columns.values()))[key])
            for i in range(n):
                if g.kind == "attn":
                    kind, index = "head", i
                elif g.kind == "sae":
                    kind, index = ("feature", i) if key.endswith(":feats") else ("error", -1)
                else:
                    kind, index = g.kind, -1
                row = {
                    "key": key,
                    "kind": kind,
                    "layer": g.layer,
                    "index": index,
                    "site": g.site,
                    "order": g.order,
                }
                rows.append(row | {name: float(v[key][i]) for name, v in columns.items()})
    return pd.DataFrame(rows)


@torch.no_grad()
def activation_change(sp: Spliced, clean: dict, corr: dict) -> dict[str, torch.Tensor]:
    """Per SAE, per prompt, how much the corruption moves each feature: sum over positions of
    |a_clean - a_corr| times the norm of its decoder row [b, d_sae] (no gradient needed)."""
    out = {}
    for g in sp.groups:
        if g.kind == "sae":
            key = g.name + ":feats"
            norms = sp.saes[g.hook].W_dec.norm(dim=1).float()
            out[key] = (clean[key] - corr[key]).abs().float().sum(1) * norms
    return out


def fast_pass(
    sp: Spliced,
    prompts: pd.DataFrame,
    cfg: AttributionConfig,
    backoff: memory.OOMBackoff,
    selection: np.ndarray,
    checked: np.ndarray,
) -> tuple[Sums, Sums, Kept, torch.Tensor]:
    """The fast method over every prompt, batch by batch: (its node scores summed over all
    prompts, the `selection` half and the validation prompts `checked`; activation_change
    summed; the validation prompts' gradients and clean metric (Kept); the sums of the clean
    and corrupted metrics [2], float64 on the device).

    Everything a batch adds stays on the device or goes to the host in one copy that does not
    block (Kept), so the host never waits for the device inside the loop (a GPU runs ahead
    until the means are read: tests/attribution/test_attribution_no_sync.py)."""
    method = cfg.method_record
    device = next(sp.model.parameters()).device
    fast, moved = Sums(selection=selection, validation=checked), Sums()
    kept = Kept(prompts, checked, device)

    def fast_batch(batch: Batch):
        with torch.no_grad():
            run_corr = sp.run(batch.corrupted)
        corr = {k: v.detach() for k, v in run_corr.acts.items()}
        scores, metric, clean, grads = method.score_batch(sp, batch, corr, cfg)
        kept.add(batch, grads, metric)
        m_corr = logit_diff(run_corr.logits, batch.answer, batch.distractor)
        return scores, activation_change(sp, clean, corr), metric, m_corr

    metric_sums = torch.zeros(2, dtype=torch.float64, device=device)
    with sp.counter.part(method.name):
        for batch, (scores, change, metric, metric_corr) in run_batches(
            prompts, backoff, device, fast_batch, fast.masks(len(prompts)), checked
        ):
            for k, v in scores.items():
                fast.add(k, v, batch.member)
            for k, v in change.items():
                moved.add(k, v, batch.member[:1])  # the first row: every prompt
            fast.count(batch.rows)
            metric_sums += torch.stack([metric.sum(), metric_corr.sum()]).double()
    return fast, moved, kept, metric_sums


def score_nodes(
    model,
    prompts: pd.DataFrame,
    saes: dict[str, Any],
    cfg: AttributionConfig,
    bypass_bos: bool = False,
) -> NodeScores:
    """Score every node with the fast method on every prompt, and patch a bounded set of nodes
    exactly on the validation prompts (the reference): the embedding, MLPs and error terms, the
    top `validation_heads` heads and `validation_features` features (exact_node_list)."""
    for p in model.parameters():
        p.requires_grad_(False)
    device = next(model.parameters()).device
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    sp = Spliced.of(model, saes, bypass_bos)
    selection = selection_half(prompts)
    checked = validation_mask(prompts, cfg)
    t0 = time.perf_counter()
    size = max(1, min(cfg.batch_size, len(prompts)))  # so a halving halves what runs
    backoff = memory.OOMBackoff(size, str(device), stage="attribution")
    fast, moved, kept, metric_sums = fast_pass(sp, prompts, cfg, backoff, selection, checked)
    fast_col = f"score_{cfg.method}"
    columns = {
        fast_col: fast.means(),
        f"{fast_col}_selection": fast.means("selection"),
        f"{fast_col}_validation": fast.means("validation"),
    }
    m_clean, m_corr = metric_sums.tolist()
    t_fast = time.perf_counter() - t0  # the means waited for the device
    frame = node_frame(sp.groups, columns)

    t0 = time.perf_counter()
    exact_nodes = exact_node_list(frame, cfg, moved.means())
    validation_set = prompts[checked]
    exact = Sums(selection=selection_half(validation_set))  # rows: positions in validation_set
    with sp.counter.part("exact"):
        for batch, values in run_batches(
            validation_set,
            backoff,
            device,
            lambda b: exact_batch(
                sp,
                b,
                sp.acts(b.corrupted),
                exact_nodes,
                kept.batch_metric(validation_set.index[b.rows], device),
            ),
            exact.masks(len(validation_set)),
        ):
            for node, v in values.items():
                exact.add(node, v, batch.member)
            exact.count(batch.rows)
    at = {(k, i): j for j, (k, i) in enumerate(zip(frame["key"], _patch_index(frame), strict=True))}
    for column, values in (
        ("score_exact", exact.means()),
        ("score_exact_selection", exact.means("selection")),
    ):
        filled = np.full(len(frame), np.nan)
        for node, value in values.items():
            filled[at[node]] = float(value)
        frame[column] = filled
    t_exact = time.perf_counter() - t0
    n = fast.n[None]
    seconds = {"fast": t_fast, "exact": t_exact}
    return NodeScores(frame, sp, m_clean / n, m_corr / n, seconds, n, kept)


def validation_mask(prompts: pd.DataFrame, cfg: AttributionConfig) -> np.ndarray:
    """The first `validation_prompts` prompts of each half, alternating (so both halves of the
    circuit split have exact scores), as a mask over `prompts`."""
    half = selection_half(prompts)
    k = cfg.validation_prompts
    keep = np.zeros(len(prompts), dtype=bool)
    for mask in (half, ~half):
        keep[np.flatnonzero(mask)[: (k + 1) // 2 if mask is half else k // 2]] = True
    return keep


def validation_prompts(prompts: pd.DataFrame, cfg: AttributionConfig) -> pd.DataFrame:
    """The prompts exact patching, edges and their validation run on (validation_mask)."""
    return prompts[validation_mask(prompts, cfg)]


def _patch_index(frame: pd.DataFrame) -> list[int]:
    """Index used when patching: head / feature index, 0 for single-node groups."""
    return [int(i) if i >= 0 else 0 for i in frame["index"]]


def exact_node_list(
    frame: pd.DataFrame, cfg: AttributionConfig, moved: dict[str, np.ndarray]
) -> list[tuple[str, int]]:
    """The nodes patched exactly: the embedding, every MLP and every SAE's error term; the top
    `validation_heads` heads by |fast score|; `validation_features` features over every SAE,
    half the top by |fast score| and half the top by `moved` (activation_change), whose
    ranking needs no gradient."""
    fast_col = f"score_{cfg.method}"
    nodes = [(r.key, 0) for r in frame.itertuples() if r.kind in ("embedding", "mlp", "error")]
    heads = frame[frame["kind"] == "head"]
    top_heads = heads.reindex(heads[fast_col].abs().sort_values(ascending=False).index)
    nodes += [(r.key, int(r.index)) for r in top_heads.head(cfg.validation_heads).itertuples()]
    feats = frame[frame["kind"] == "feature"].copy()
    feats["moved"] = [float(moved[r.key][int(r.index)]) for r in feats.itertuples()]
    by_fast = feats.reindex(feats[fast_col].abs().sort_values(ascending=False).index)
    chosen = [
        (r.key, int(r.index)) for r in by_fast.head((cfg.validation_features + 1) // 2).itertuples()
    ]
    for r in feats.sort_values("moved", ascending=False).itertuples():
        if len(chosen) >= cfg.validation_features or r.moved <= 0:
            break
        if (r.key, int(r.index)) not in chosen:
            chosen.append((r.key, int(r.index)))
    return nodes + chosen


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    from scipy.stats import spearmanr

    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return None
    rho = spearmanr(a[ok], b[ok]).statistic
    return None if math.isnan(rho) else float(rho)


def inert(fast: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Nodes that cannot move the metric on the validation prompts, a pruned head (W_O = 0) or a
    feature the corruption does not move: both methods give exactly 0. Counted in, such ties pad the
    rank agreement or break it (the embedded model keeps 3 of its 8 heads: with seed 1, facts'
    heads ranked 0.53 over 8 and 1.0 over the 3 that can move it)."""
    return (fast == 0) & (exact == 0)


MIN_KIND_NODES = 3  # a node kind with this many nodes must pass for the validation to pass


def undefined_why(n_nodes: int, n_inert: int) -> str:
    """Why a validation's spearman is null, for `n_nodes` compared and `n_inert` left out."""
    if n_nodes == 0 and n_inert:
        return (
            "every node scores exactly 0 by both methods: nothing moves the metric (clean and "
            "corrupted prompts give the same metric, or it does not depend on the input)"
        )  # fmt: skip
    if n_nodes < 3:
        return f"{n_nodes} nodes can move the metric: a rank correlation needs 3"
    return "the fast or the exact scores are all equal"


def validation(frame: pd.DataFrame, method: str, threshold: float) -> dict[str, Any]:
    """Rank agreement of the fast method with exact patching on the same (validation) prompts,
    on the nodes where both exist and the node can move the metric (`inert`, counted in
    `n_inert`): over all of them and kind by kind (`by_kind`: heads, features, errors, ...).

    `passed` is the verdict a reader takes away, so it is true only when the agreement over
    all nodes passes (`passed_all_nodes`) and so does every kind with at least
    `MIN_KIND_NODES` nodes (`failed_kinds` lists those that do not): pooled over kinds, many
    well-ranked features can hide heads ranked backwards (induction on the embedded model:
    0.94 over all nodes and -1.0 over its 3 heads on one training, 0.91 and -0.5 on another)."""
    fast = frame[f"score_{method}_validation"].to_numpy()
    exact = frame["score_exact"].to_numpy()
    still = inert(fast, exact)
    both = ~np.isnan(exact) & ~still

    def agreement(mask: np.ndarray) -> dict[str, Any]:
        rho = spearman(fast[mask & both], exact[mask & both])
        passed = None if rho is None else bool(rho >= threshold)
        n_inert = int((mask & still).sum())
        n = int((mask & both).sum())
        return {
            "spearman": rho,
            "n_nodes": n,
            "n_inert": n_inert,
            "passed": passed,
            "spearman_undefined": None if rho is not None else undefined_why(n, n_inert),
        }

    kinds = sorted(frame.loc[~np.isnan(exact), "kind"].unique().tolist())
    by_kind = {k: agreement(frame["kind"].to_numpy() == k) for k in kinds}
    overall = agreement(np.ones(len(frame), dtype=bool))
    judged = {k: v for k, v in by_kind.items() if v["n_nodes"] >= MIN_KIND_NODES}
    failed = sorted(k for k, v in judged.items() if v["passed"] is not True)
    pooled = overall["passed"]
    return {
        "method": method,
        "reference": "exact",
        "threshold": threshold,
        **overall,
        "passed": None if pooled is None else bool(pooled and not failed),
        "passed_all_nodes": pooled,
        "min_kind_nodes": MIN_KIND_NODES,
        "failed_kinds": failed,
        "kinds": kinds,
        "by_kind": by_kind,
    }


def with_score(frame: pd.DataFrame, method: str) -> pd.DataFrame:
    """`score` (and `score_selection`): exact where computed (the reference), else the fast
    method; `score_source` says which."""
    frame = frame.copy()
    exact = frame["score_exact"]
    frame["score"] = exact.where(exact.notna(), frame[f"score_{method}"])
    exact_sel = frame["score_exact_selection"]
    frame["score_selection"] = exact_sel.where(exact.notna(), frame[f"score_{method}_selection"])
    frame["score_source"] = np.where(exact.notna(), "exact", method)
    return frame


def _scores(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame if c.startswith("score_") and c != "score_source"]


def heads_table(frame: pd.DataFrame) -> pd.DataFrame:
    heads = frame[frame["kind"] == "head"].rename(columns={"index": "head"})
    cols = ["layer", "head", "score", *_scores(heads), "score_source"]
    heads = heads[cols].sort_values("score", key=np.abs, ascending=False)
    heads["rank"] = np.arange(1, len(heads) + 1)
    return heads.reset_index(drop=True)


def features_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Features and each SAE's error node (feature = -1, kind = error)."""
    feats = frame[frame["kind"].isin(["feature", "error"])].rename(columns={"index": "feature"})
    cols = ["site", "layer", "feature", "kind", "score", *_scores(feats), "score_source"]
    feats = feats[cols].sort_values("score", key=np.abs, ascending=False)
    feats["rank"] = np.arange(1, len(feats) + 1)
    return feats.reset_index(drop=True)


def components_table(frame: pd.DataFrame) -> pd.DataFrame:
    comp = frame[frame["kind"].isin(["embedding", "head", "mlp"])]
    cols = ["kind", "layer", "index", "score", *_scores(comp), "score_source"]
    return comp[cols].sort_values("score", key=np.abs, ascending=False).reset_index(drop=True)


# --- memory ---------------------------------------------------------------------------------------
def plan_attribution_batch(
    model, prompts: pd.DataFrame, saes: dict[str, Any], cfg: AttributionConfig
):
    """The memory plan's batch size (prompts), at most `cfg.batch_size`: the gradient passes hold
    every layer's activations and every SAE's features, so a batch that fits a small model can
    exceed a GPU on a real one; the validation prompts' kept gradients are on the host (on CPU,
    the same memory). Batching changes no score (each is a mean over prompts).
    Returns memory.BatchPlan."""
    params = list(model.parameters())
    device = str(params[0].device)
    length = max((len(t) for t in prompts["clean_tokens"]), default=1)
    d_sae = max((sae.cfg.d_sae for sae in saes.values()), default=0)
    kept = int(validation_mask(prompts, cfg).sum())  # prompts whose gradients are kept
    estimate = estimate_attribution(
        model.cfg, sum(p.numel() for p in params), length, len(saes), d_sae, params[0].dtype,
        device, cfg.method, kept,
    )  # fmt: skip
    loaded = estimate.weights  # the model and SAEs are on the device already
    return memory.plan_batch_size(
        estimate, cfg.batch_size, available=memory.available_bytes(device) + loaded
    )
