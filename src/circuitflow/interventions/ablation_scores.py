"""Node attribution against the run's ablation: what each node is worth to the behaviour when it
is ablated as the interventions stage ablates it (zero, mean or resample, ablation.py), rather
than when it is patched from the corrupted prompt (attribution/scores.py).

Patching scores measure what carries the clean/corrupted difference: a node that every prompt
needs but that a prompt and its corruption share scores 0 there, however much the behaviour
needs it. A circuit judged by zero, mean or resample ablation must be ranked by the same
counterfactual (MIB, Mueller et al. 2025: EAP-IG with the evaluation's baseline).

The baseline of a node is its ablated value, as `Intervener._reference` defines it for the run:
0 (`zero`), its position-wise mean over the reference prompts (`mean`), or its value on the
permuted corrupted prompt of the seed's draw (`resample`). The fast methods of
attribution/methods run unchanged with that baseline in place of the corrupted activations:
`atp` is g . (a_clean - a_ablated), `ig` integrates the gradient along the straight line from
every node's ablated value to its clean one; both take each node's direct effect exactly
(attribution/direct.py). The reference is exact ablation of each node alone (one ablated run a
node, batched and cached by stats.Runs), and the fast scores are validated against it kind by
kind with attribution's own `validation` (Spearman over nodes that can move the metric).

Signs follow the interventions' effects: score = m(clean) - m(node ablated), positive when the
node supports the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.attribution import methods
from circuitflow.attribution.scores import node_frame, validation
from circuitflow.attribution.splice import Batch, Spliced
from circuitflow.interventions.ablation import Intervener
from circuitflow.interventions.config import EXACT_FEATURES
from circuitflow.interventions.stats import Runs
from circuitflow.nodes import Node

FAST_METHODS = ("atp", "ig")


def key_part(sp: Spliced, key: str) -> tuple[str, str]:
    """(hook, part) of a spliced key, as the Intervener names a reference: `acts` for the
    embedding, heads and MLPs, `feats` and `error` for an SAE's features and error term."""
    group = sp.group_of[key]
    if key.endswith(":feats"):
        return group.hook, "feats"
    if key.endswith(":error"):
        return group.hook, "error"
    return group.hook, "acts"


@torch.no_grad()
def baseline(
    iv: Intervener, sp: Spliced, clean: dict[str, torch.Tensor], g: int, rows, seed: int
) -> dict[str, torch.Tensor]:
    """Per key, the node tensor every node of it takes when ablated, for prompts `rows` of the
    Intervener's group `g` (shaped as `clean[key]`, [b, p, ...])."""
    perm = [iv._permutation(seed, iv.groups[g])]
    out = {}
    for key, act in clean.items():
        hook, part = key_part(sp, key)
        ref = torch.as_tensor(iv._reference(hook, part, g, rows, perm))
        ref = ref.to(device=act.device, dtype=act.dtype)
        if ref.dim() == act.dim() + 1:  # mean [1, 1, p, ...], resample [1, b, p, ...]
            ref = ref[0]
        out[key] = ref.expand_as(act).clone()
    return out


def node_of(row) -> Node:
    """The circuitflow Node of a node_frame row."""
    site = row.site if row.kind in ("feature", "error") else None
    return Node.of(row.kind, row.layer, row.index, site)


@dataclass(frozen=True)
class _MethodConfig:
    ig_steps: int


@dataclass
class AblationScores:
    """One row per node (key, kind, layer, index, site, order, node: its id) with
    `ablation_score_<method>` (over every prompt), `..._selection`, `ablation_score_exact`
    (each node ablated alone, where computed), `..._selection` and `ablation_score`,
    `ablation_score_selection`: exact where computed, else the fast method, as
    attribution's `score`; `validation` is attribution/scores.validation of the fast method
    against the exact ablation."""

    frame: pd.DataFrame
    method: str
    ablation: str
    validation: dict[str, Any]
    passes: float  # forward-pass equivalents a prompt the fast pass spent (counted)

    def ranked(self, nodes: list[Node] | None = None) -> list[Node]:
        """Nodes (all of them, or those in `nodes`) by |ablation_score_selection|, ties in
        forward order."""
        frame = self.frame.assign(_abs=self.frame["ablation_score_selection"].abs())
        frame = frame.sort_values(["_abs", "order", "index"], ascending=[False, True, True])
        order = [Node.parse(i) for i in frame["node"]]
        if nodes is None:
            return order
        keep = set(nodes)
        return [n for n in order if n in keep]


def fast_scores(
    iv: Intervener,
    runs_seeds: list[int],
    saes: dict[str, Any],
    method: str,
    ig_steps: int,
    selection: np.ndarray,
    bypass_bos: bool = False,
) -> tuple[pd.DataFrame, Spliced]:
    """The fast method with the ablation's baseline, on every prompt, over the seeds (only the
    first for zero and mean, whose baseline does not depend on the seed): a node_frame with
    `ablation_score_<method>` (every prompt) and `..._selection` (the `selection` mask),
    float64 means of the float32 per-prompt scores."""
    if method not in FAST_METHODS:
        raise ValueError(f"ablation scores: method {method!r}; allowed: {', '.join(FAST_METHODS)}")
    record = methods.get(method)
    sp = Spliced.of(iv.model, saes, bypass_bos)
    sp.counter = iv.counter
    seeds = runs_seeds if iv.kind == "resample" else runs_seeds[:1]
    cfg = _MethodConfig(ig_steps)
    sums: dict[str, np.ndarray] = {}
    n_all, n_sel = 0, 0
    dev = iv.device
    for seed in seeds:
        for g, group in enumerate(iv.groups):

            def one(start: int, stop: int, g=g, group=group, seed=seed):
                """Per key, the batch's scores summed over its prompts and over its selection
                prompts [2, n_nodes] (float64 on the host), and its prompts' rows."""
                rows = np.arange(start, stop)
                batch = Batch(
                    group.clean[rows].to(dev),
                    group.corrupted[rows].to(dev),
                    group.answer[rows].to(dev),
                    group.distractor[rows].to(dev),
                    group.rows[rows],
                )
                ref = baseline(iv, sp, sp.acts(batch.clean), g, rows, seed)
                scores, *_ = record.score_batch(sp, batch, ref, cfg)
                sel = torch.as_tensor(selection[group.rows[rows]], device=dev, dtype=torch.float64)
                return {
                    k: torch.stack([v.double().sum(0), sel @ v.double()]).cpu().numpy()
                    for k, v in scores.items()
                }, group.rows[rows]

            # Batches halve on running out of memory (memory.OOMBackoff), as every ablated run.
            for batch_sums, rows in iv.backoff.chunks(len(group.rows), one):
                for key, both in batch_sums.items():
                    sums[key] = sums[key] + both if key in sums else both
                n_all += len(rows)
                n_sel += int(selection[rows].sum())
    col = f"ablation_score_{method}"
    columns = {
        col: {k: v[0] / max(n_all, 1) for k, v in sums.items()},
        f"{col}_selection": {k: v[1] / max(n_sel, 1) for k, v in sums.items()},
    }
    frame = node_frame(sp.groups, columns)
    frame["node"] = [node_of(r).id for r in frame.itertuples()]
    return frame, sp


def exact_effects(
    runs: Runs, nodes: list[Node], selection: np.ndarray
) -> dict[Node, tuple[float, float]]:
    """Per node, (m(clean) - m(node ablated alone)) over every prompt and over `selection`,
    means over the seeds (resample draws anew per seed): the exact reference, one ablated run a
    node, batched (stats.Runs)."""
    runs.prefetch([[n] for n in nodes])
    base = runs.base.logit_diff
    out = {}
    for node in nodes:
        drops = np.array([base - runs.get([node], s).logit_diff for s in runs.seeds])
        out[node] = (float(drops.mean()), float(drops[:, selection].mean()))
    return out


def ablation_scores(
    runs: Runs,
    saes: dict[str, Any],
    selection: np.ndarray,
    method: str = "ig",
    ig_steps: int = 8,
    exact: list[Node] | None = None,
    threshold: float = 0.8,
    bypass_bos: bool = False,
    exact_features: int = EXACT_FEATURES,
) -> AblationScores:
    """Score every node against the run's ablation with the fast `method`, and every node of
    `exact` (default: every node that is not an SAE feature, that is the components and error
    terms, and the top `exact_features` features by |fast score|) by its exact ablation, then
    validate the one against the other (`threshold`: attribution.spearman_threshold's
    role)."""
    iv = runs.iv
    before = iv.counter.total()  # counted in the caller's part (the stage's `circuits`)
    frame, _ = fast_scores(iv, runs.seeds, saes, method, ig_steps, selection, bypass_bos)
    passes = (iv.counter.total() - before) / max(iv.n, 1)
    nodes = [Node.parse(i) for i in frame["node"]]
    if exact is None:
        exact = [n for n in nodes if n.kind != "feature"]
        feats = frame[frame["kind"] == "feature"]
        top = feats[f"ablation_score_{method}"].abs().sort_values(ascending=False, kind="stable")
        exact += [Node.parse(feats.loc[i, "node"]) for i in top.index[:exact_features]]
    effects = exact_effects(runs, exact, selection)
    col = f"ablation_score_{method}"
    frame["ablation_score_exact"] = [effects.get(n, (np.nan, np.nan))[0] for n in nodes]
    frame["ablation_score_exact_selection"] = [effects.get(n, (np.nan, np.nan))[1] for n in nodes]
    has = frame["ablation_score_exact"].notna()
    frame["ablation_score"] = frame["ablation_score_exact"].where(has, frame[col])
    frame["ablation_score_selection"] = frame["ablation_score_exact_selection"].where(
        has, frame[f"{col}_selection"]
    )
    frame["ablation_score_source"] = np.where(has, "exact", method)
    # attribution's validation reads score_<method>_validation against score_exact: the same
    # prompts (every prompt) on both sides.
    check = pd.DataFrame(
        {
            "kind": frame["kind"],
            f"score_{method}_validation": frame[col],
            "score_exact": frame["ablation_score_exact"],
        }
    )
    verdict = validation(check, method, threshold) | {"reference": f"exact {iv.kind} ablation"}
    return AblationScores(frame, method, iv.kind, verdict, passes)
