"""SAE features: the top features by attribution ablated next to random active ones, and
steered along their decoder direction next to a random direction of the same norm."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.interventions.ablation import Intervener, Request
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.stats import Runs
from circuitflow.nodes import Node, hook_name

log = logging.getLogger(__name__)


def active_features(iv: Intervener, hook: str) -> np.ndarray:
    """Features of the SAE at `hook` that fire somewhere on the clean prompts."""
    fired = None
    for g in range(len(iv.groups)):
        f = iv._feature_acts(hook, "clean", g)
        any_g = (f > 0).flatten(0, -2).any(0).cpu().numpy()
        fired = any_g if fired is None else fired | any_g
    return np.flatnonzero(fired) if fired is not None else np.array([], dtype=int)


def feature_interventions(
    runs: Runs,
    attribution_features: pd.DataFrame | None,
    saes: dict[str, Any],
    tokenizer: Any,
    cfg: InterventionsConfig,
    base_seed: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ablation table, steering table) for the top features by attribution and controls."""
    empty_ablate = pd.DataFrame(columns=["site", "layer", "feature", "set", "score", "score_std"])
    empty_steer = pd.DataFrame(columns=["site", "layer", "feature", "direction", "alpha"])
    if attribution_features is None or not saes or cfg.n_features == 0:
        return empty_ablate, empty_steer
    feats = attribution_features[attribution_features["kind"] == "feature"]
    feats = feats[[hook_name(r.site, int(r.layer)) in saes for r in feats.itertuples()]]
    # A feature scored exactly 0 cannot move the metric (it fires on neither prompt of any
    # pair: a dead dictionary's every feature; or the pairs do not differ): left out, as inert
    # heads are, so its ablation is not reported as a finding of 0.
    inert = feats["score"] == 0
    feats = feats[~inert]
    if feats.empty:
        log.warning(
            "no SAE feature has a non-zero attribution score (%d inert: a dead dictionary, or "
            "clean and corrupted prompts that do not differ): no feature ablated or steered",
            int(inert.sum()),
        )  # fmt: skip
        return empty_ablate, empty_steer
    feats = feats.reindex(feats["score"].abs().sort_values(ascending=False).index)
    top = feats.head(cfg.n_features)
    attr_score = {
        (r.site, int(r.layer), int(r.feature)): float(r.score) for r in feats.itertuples()
    }
    chosen = [(r.site, int(r.layer), int(r.feature), "top") for r in top.itertuples()]
    for site, layer in sorted({(r.site, int(r.layer)) for r in top.itertuples()}):
        hook = hook_name(site, layer)
        pool = np.setdiff1d(active_features(runs.iv, hook), top["feature"].astype(int).to_numpy())
        rng = np.random.default_rng([base_seed, layer, 31])
        pick = rng.choice(pool, min(cfg.n_random_features, len(pool)), replace=False)
        chosen += [(site, layer, int(f), "random") for f in sorted(pick)]
    runs.prefetch([[Node("feature", layer, f, site)] for site, layer, f, _ in chosen])
    rows = [
        {"site": site, "layer": layer, "feature": f, "set": which}
        | runs.effect([Node("feature", layer, f, site)], cfg.ci_level)
        | {"attribution_score": attr_score.get((site, layer, f), np.nan)}
        for site, layer, f, which in chosen
    ]
    ablate = pd.DataFrame(rows) if rows else empty_ablate

    base = runs.base
    steers = []  # (row r, direction kind, alpha, decoder direction, steering Request)
    for r in top.itertuples():
        hook = hook_name(r.site, int(r.layer))
        direction = saes[hook].W_dec[int(r.feature)].detach().float().cpu()
        g = torch.Generator().manual_seed(base_seed * 100003 + int(r.layer) * 1009 + int(r.feature))
        rand = torch.randn(direction.shape, generator=g)
        rand = rand / rand.norm() * direction.norm()
        for kind, vec in (("feature", direction), ("random", rand)):
            for alpha in cfg.steering_alphas:
                steer = ((hook, alpha * vec),) if alpha else ()
                steers.append((r, kind, alpha, direction, Request(seed=runs.seeds[0], steer=steer)))
    # All steered runs at once, many per forward pass; alpha 0 is the clean run.
    outs = runs.iv.run_many([req for *_, req in steers if req.steer])[::-1]
    steer_rows = []
    for r, kind, alpha, direction, req in steers:
        site, layer, f = r.site, int(r.layer), int(r.feature)
        out = outs.pop() if req.steer else base
        delta = out.mean_logits - base.mean_logits
        # At alpha 0 nothing moves: no top tokens to name.
        up = np.argsort(-delta, kind="stable")[: cfg.top_tokens] if alpha else []
        steer_rows.append(
            {
                "site": site,
                "layer": layer,
                "feature": f,
                "direction": kind,
                "alpha": float(alpha),
                "decoder_norm": float(direction.norm()),
                "logit_diff": float(out.logit_diff.mean()),
                "logit_diff_change": float(out.logit_diff.mean() - base.logit_diff.mean()),
                "accuracy": float(out.correct.mean()),
                "top1_changed": float((out.top_token != base.top_token).mean()),
                "top_tokens": [decode(tokenizer, int(t)) for t in up],
                "top_token_logit_change": [float(delta[t]) for t in up],
                "attribution_score": float(r.score),
            }
        )
    steering = pd.DataFrame(steer_rows) if steer_rows else empty_steer
    return ablate, steering


def decode(tokenizer: Any, token: int) -> str:
    if tokenizer is None:
        return str(token)
    try:
        return tokenizer.decode([token])
    except Exception:  # noqa: BLE001 - a token the tokenizer cannot render: show its id
        return str(token)
