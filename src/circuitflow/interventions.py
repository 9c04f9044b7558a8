"""Interventions: test what attribution claims by changing the model and measuring the behaviour.

Metric m: mean logit difference (answer - distractor, last position) over the behaviour's clean
prompts. M is the unmodified model; ablations use one kind (`zero`, `mean`, `resample`, see
`circuitflow.ablation`), recorded in every table and in summary.json.

* Circuits. Candidate nodes (`circuit_nodes: features`, the default) are the components
  (token embedding, every head, every MLP), every SAE feature that fires on the behaviour's
  clean prompts and every SAE's error term, as in Marks et al. 2024: the SAEs make the residual
  stream itself a set of nodes, so a circuit can keep the token- and concept-specific directions
  that carry the behaviour and drop the rest. `components` uses the components only. Nodes are
  ranked by |attribution score|. C_n = the top n nodes, and for each n:
  faithfulness(n) = (m(C_n) - m(empty)) / (m(M) - m(empty)) with every node outside C_n ablated;
  completeness(n) = (m(M) - m(M minus C_n)) / (m(M) - m(empty)) with C_n ablated and the rest
  kept: the share of the model's effect that is lost without the circuit (1 = nothing outside
  the circuit can do the task; it is 1 - the complement's faithfulness of Marks et al. 2024).
  Control: at each n, random circuits of n nodes (`n_random_circuits` draws). The smallest
  faithful n is found on the grid of sizes and then by bisection between the last unfaithful
  and the first faithful grid size. The attribution graph's own node set is scored as well.
* Heads. Every head alone; every pair and triplet (up to `max_set_size`) among the top-k heads by
  attribution, with the additive prediction (sum of single effects) and the interaction, and
  random head sets of each size as the control.
* Features. The top features by attribution, ablated, next to random active features of the same
  SAE; and steered: alpha * W_dec[f] added at the feature's site, next to a random direction of
  the same norm, with the top tokens whose mean logit rises most.

Statistics: effects are m(M) - m(ablated) (`score`, positive = the node supports the answer, as
in attribution), as a share of m(M) (`drop_frac`), the change in accuracy (answer beats
distractor) and in calibration error. Each is repeated over `n_seeds` seeds, each a bootstrap
resample of the prompts (and, for resample ablation, a new draw of the corrupted prompts):
columns `<x>` hold the mean across seeds, `<x>_std` the std; `score_ci_low/high` is a
t-interval over prompts on the full set, `p_value` a paired t-test against no effect.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.ablation import (
    Intervener,
    Node,
    Outcome,
    calibration_error,
    component_nodes,
    head_nodes,
)
from circuitflow.attribution import sae_hook, sae_site_layer

log = logging.getLogger(__name__)

CIRCUIT_NODES = ("features", "components")
METRIC = "logit_diff (answer - distractor, last position), mean over prompts"


@dataclass(frozen=True)
class InterventionsConfig:
    """The `interventions:` config section (see workflow/schemas/config.schema.yaml)."""

    ablation: str = "mean"  # zero | mean | resample
    mean_reference: str = "clean"  # clean | corrupted prompts (mean ablation)
    batch_size: int = 64
    max_prompts: int | None = None
    n_seeds: int = 3
    ci_level: float = 0.95
    circuit_sizes: list[int] | None = None  # null: every size when <= 64 nodes, else a grid
    circuit_size: int | None = None  # null: the smallest faithful size
    circuit_nodes: str = "features"  # features (components + SAE features + errors) | components
    faithfulness_threshold: float = 0.8
    n_random_circuits: int = 10
    top_k_heads: int = 5
    max_set_size: int = 3
    n_random_sets: int = 10
    n_features: int = 4
    n_random_features: int = 4
    steering_alphas: tuple[float, ...] = (-8.0, -4.0, -2.0, 0.0, 2.0, 4.0, 8.0)
    top_tokens: int = 5

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> InterventionsConfig:
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"interventions: unknown keys {sorted(unknown)}")
        if "steering_alphas" in d:
            d["steering_alphas"] = tuple(float(a) for a in d["steering_alphas"])
        if d.get("circuit_nodes", "features") not in CIRCUIT_NODES:
            raise ValueError(
                f"interventions.circuit_nodes: {d['circuit_nodes']!r}; allowed values: "
                + ", ".join(CIRCUIT_NODES)
            )
        if d.get("circuit_sizes") is not None:
            d["circuit_sizes"] = [int(n) for n in d["circuit_sizes"]]
        return cls(**d)


# --- statistics -------------------------------------------------------------------------------
def seeds_for(cfg: InterventionsConfig, base_seed: int) -> list[int]:
    return [base_seed + i for i in range(cfg.n_seeds)]


def bootstrap_rows(n: int, seed: int) -> np.ndarray:
    """The prompts of one seed's bootstrap resample (with replacement)."""
    return np.random.default_rng([seed, 1000003]).integers(0, n, n)


def t_interval(x: np.ndarray, level: float) -> tuple[float, float, float]:
    """(low, high, two-sided p-value against mean 0) of the mean of x."""
    from scipy import stats

    n = len(x)
    mean = float(np.mean(x))
    if n < 2 or np.std(x) == 0:
        return mean, mean, (1.0 if mean == 0 else 0.0)
    se = float(np.std(x, ddof=1) / np.sqrt(n))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
    return mean - half, mean + half, p


class Runs:
    """Cached ablation runs: zero and mean ablations do not depend on the seed, so one run
    serves every seed; resample ablation draws anew per seed."""

    def __init__(self, iv: Intervener, seeds: list[int]):
        self.iv = iv
        self.seeds = seeds
        self.cache: dict[tuple, Outcome] = {}
        self.base = iv.run(())
        self.n_runs = 1

    def get(self, nodes, seed: int) -> Outcome:
        nodes = frozenset(nodes)
        if not nodes:
            return self.base
        key = (nodes, seed if self.iv.kind == "resample" else None)
        if key not in self.cache:
            self.cache[key] = self.iv.run(sorted(nodes), seed=seed)
            self.n_runs += 1
        return self.cache[key]

    def effect(self, nodes, level: float) -> dict[str, float]:
        """Effect of ablating `nodes` together: mean and std across seeds, CI over prompts."""
        base = self.base
        per_seed = []
        for seed in self.seeds:
            out = self.get(nodes, seed)
            idx = bootstrap_rows(len(base.logit_diff), seed)
            m0, m1 = base.logit_diff[idx].mean(), out.logit_diff[idx].mean()
            per_seed.append(
                {
                    "score": m0 - m1,
                    "drop_frac": (m0 - m1) / m0 if m0 != 0 else np.nan,
                    "logit_diff": m1,
                    "accuracy": out.correct[idx].mean(),
                    "accuracy_change": out.correct[idx].mean() - base.correct[idx].mean(),
                }
            )
        frame = pd.DataFrame(per_seed)
        row: dict[str, float] = {}
        for col in frame:
            row[col] = float(frame[col].mean())
            row[f"{col}_std"] = float(frame[col].std(ddof=1)) if len(frame) > 1 else 0.0
        first = self.get(nodes, self.seeds[0])
        low, high, p = t_interval(base.logit_diff - first.logit_diff, level)
        row |= {"score_ci_low": low, "score_ci_high": high, "p_value": p}
        ece = calibration_error(first)
        row |= {"calibration_error": ece, "calibration_error_change": ece - self.base_ece}
        return row

    @property
    def base_ece(self) -> float:
        if not hasattr(self, "_base_ece"):
            self._base_ece = calibration_error(self.base)
        return self._base_ece


# --- circuits ---------------------------------------------------------------------------------
def component_node(kind: str, layer: int, index: int) -> Node:
    if kind == "embedding":
        return Node("embedding")
    if kind == "head":
        return Node("head", int(layer), int(index))
    if kind == "mlp":
        return Node("mlp", int(layer))
    raise ValueError(f"not a component kind: {kind!r}")


def ranked_nodes(
    components: pd.DataFrame,
    features: pd.DataFrame | None = None,
    active: dict[tuple[str, int], np.ndarray] | None = None,
) -> list[Node]:
    """Circuit candidates by |attribution score| (ties in forward order): the components table
    (kind, layer, index, score); with `features` (attribution's features table) and `active`
    ((site, layer) -> features that fire on the prompts), also every active feature (score 0
    when attribution did not score it) and the error term of each SAE in `active`."""
    scored = [
        (float(r.score), (int(r.layer), 0), component_node(r.kind, r.layer, r.index))
        for r in components.itertuples()
    ]
    if features is not None and active:
        score = {
            (r.kind, r.site, int(r.layer), int(r.feature)): float(r.score)
            for r in features.itertuples()
        }
        for (site, layer), fired in sorted(active.items()):
            # After the layer's components: resid_post features are that layer's output.
            order = (layer, 1)
            scored.append(
                (score.get(("error", site, layer, -1), 0.0), order, Node("error", layer, -1, site))
            )
            for f in fired:
                node = Node("feature", layer, int(f), site)
                scored.append((score.get(("feature", site, layer, int(f)), 0.0), order, node))
    scored.sort(key=lambda t: (-abs(t[0]), t[1], t[2]))
    return [node for *_, node in scored]


def graph_nodes(graph: dict[str, Any] | None, universe: list[Node]) -> list[Node]:
    """The attribution graph's nodes that are circuit candidates (its claim, as a circuit)."""
    if not graph:
        return []
    ids = {node.id: node for node in universe}
    return [ids[n["id"]] for n in graph.get("nodes", []) if n["id"] in ids]


def circuit_sizes(n_nodes: int, cfg: InterventionsConfig, extra: list[int]) -> list[int]:
    if cfg.circuit_sizes is not None:
        sizes = set(cfg.circuit_sizes)
    elif n_nodes <= 64:
        sizes = set(range(n_nodes + 1))
    else:
        sizes = {0, n_nodes, *np.unique(np.geomspace(1, n_nodes, 24).round().astype(int))}
    sizes |= {n for n in extra if n is not None}
    return sorted(n for n in sizes if 0 <= n <= n_nodes)


def _ratio(num: np.ndarray, den: np.ndarray) -> float:
    return float(num / den) if den != 0 else float("nan")


def circuit_curves(
    runs: Runs,
    ranked: list[Node],
    sizes: list[int],
    cfg: InterventionsConfig,
    base_seed: int,
    named: list[Node] | None = None,
    controls: bool = True,
) -> pd.DataFrame:
    """One row per (circuit, n, draw): the top-n circuit (`circuit` = top, draw -1; faithfulness
    and completeness as mean and std across seeds), random circuits (`random`, one draw each,
    on all prompts; none when `controls` is false) and, when given, the `named` node set
    (`graph`, seed-averaged like top)."""
    universe = list(ranked)
    everything = frozenset(universe)
    base = runs.base
    n_prompts = len(base.logit_diff)
    rows = []

    def measure(circuit: frozenset, seed: int, idx: np.ndarray) -> dict[str, float]:
        empty = runs.get(everything, seed)
        m_full = base.logit_diff[idx].mean()
        m_empty = empty.logit_diff[idx].mean()
        m_c = runs.get(everything - circuit, seed).logit_diff[idx].mean()
        m_rest = runs.get(circuit, seed).logit_diff[idx].mean()
        den = m_full - m_empty
        return {
            "m_full": m_full,
            "m_empty": m_empty,
            "m_circuit": m_c,
            "m_complement": m_rest,
            "faithfulness": _ratio(m_c - m_empty, den),
            "completeness": _ratio(m_full - m_rest, den),
        }

    def seed_averaged(name: str, nodes: list[Node]) -> dict[str, Any]:
        circuit = frozenset(nodes)
        per_seed = pd.DataFrame(
            [measure(circuit, s, bootstrap_rows(n_prompts, s)) for s in runs.seeds]
        )
        row: dict[str, Any] = {"circuit": name, "n": len(circuit), "draw": -1}
        for col in per_seed:
            row[col] = float(per_seed[col].mean())
            row[f"{col}_std"] = float(per_seed[col].std(ddof=1)) if len(per_seed) > 1 else 0.0
        return row | {"nodes": [node.id for node in nodes]}

    if named:
        rows.append(seed_averaged("graph", named))
    for n in sizes:
        rows.append(seed_averaged("top", ranked[:n]))
        all_rows = np.arange(n_prompts)
        draws = cfg.n_random_circuits if controls and 0 < n < len(universe) else 0
        for draw in range(draws):
            rng = np.random.default_rng([base_seed, n, draw, 17])
            pick = [universe[i] for i in sorted(rng.choice(len(universe), n, replace=False))]
            m = measure(frozenset(pick), runs.seeds[0], all_rows)
            rows.append(
                {"circuit": "random", "n": n, "draw": draw}
                | m
                | {"faithfulness_std": np.nan, "completeness_std": np.nan}
                | {"nodes": [node.id for node in pick]}
            )
    frame = pd.DataFrame(rows)
    return frame[
        [
            "circuit",
            "n",
            "draw",
            "faithfulness",
            "faithfulness_std",
            "completeness",
            "completeness_std",
            "m_circuit",
            "m_complement",
            "m_full",
            "m_empty",
            "nodes",
        ]
    ]


def random_band(curves: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per n: mean, 5% and 95% quantile of `metric` over the random circuits."""
    rand = curves[curves["circuit"] == "random"]
    return rand.groupby("n")[metric].agg(
        mean="mean", low=lambda x: x.quantile(0.05), high=lambda x: x.quantile(0.95)
    )


def smallest_faithful(curves: pd.DataFrame, threshold: float) -> int | None:
    top = curves[(curves["circuit"] == "top") & (curves["faithfulness"] >= threshold)]
    return int(top["n"].min()) if len(top) else None


def refine_smallest(
    runs: Runs,
    ranked: list[Node],
    curves: pd.DataFrame,
    cfg: InterventionsConfig,
    base_seed: int,
) -> pd.DataFrame:
    """Bisect between the first faithful size of the grid and the largest tested size below it
    (faithfulness grows with n along the ranking, mostly): the rows of every size tried are added
    to `curves`, with random controls at the smallest faithful size found."""
    hi = smallest_faithful(curves, cfg.faithfulness_threshold)
    tested = curves.loc[curves["circuit"] == "top", "n"]
    below = tested[tested < hi] if hi is not None else tested.iloc[:0]
    if hi is None or below.empty:
        return curves
    lo, first, frames = int(below.max()), hi, [curves]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        frames.append(circuit_curves(runs, ranked, [mid], cfg, base_seed, controls=False))
        if frames[-1]["faithfulness"].iloc[0] >= cfg.faithfulness_threshold:
            hi = mid
        else:
            lo = mid
    if hi != first:  # the random control at the smallest faithful size found
        found = circuit_curves(runs, ranked, [hi], cfg, base_seed)
        frames.append(found[found["circuit"] == "random"])
    order = {"top": 0, "graph": 1, "random": 2}
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(
        ["n", "circuit", "draw"], key=lambda c: c.map(order) if c.name == "circuit" else c
    ).reset_index(drop=True)


CIRCUIT_NODE_TEXT = {
    "features": "token embedding, heads, MLPs, the SAE features that fire on the prompts and each "
    "SAE's error term",
    "components": "token embedding, heads, MLPs (SAE features tested one at a time, not as "
    "circuit nodes)",
}


def count_kinds(nodes: list[Node]) -> dict[str, int]:
    return dict(Counter(node.kind for node in nodes))


def graph_summary(curves: pd.DataFrame) -> dict[str, Any] | None:
    """Faithfulness and completeness of the attribution graph's node set."""
    rows = curves[curves["circuit"] == "graph"]
    if rows.empty:
        return None
    r = rows.iloc[0]
    return {
        "n": int(r["n"]),
        "faithfulness": float(r["faithfulness"]),
        "completeness": float(r["completeness"]),
        "nodes": list(r["nodes"]),
    }


# --- heads ------------------------------------------------------------------------------------
def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def single_heads(runs: Runs, model_cfg, attribution_heads: pd.DataFrame | None, level: float):
    rows = []
    for node in head_nodes(model_cfg.n_layers, model_cfg.n_heads):
        rows.append({"layer": node.layer, "head": node.index} | runs.effect([node], level))
    frame = pd.DataFrame(rows)
    if attribution_heads is not None and len(attribution_heads):
        attr = attribution_heads[["layer", "head", "score"]].rename(
            columns={"score": "attribution_score"}
        )
        frame = frame.merge(attr, on=["layer", "head"], how="left")
    else:
        frame["attribution_score"] = np.nan
    frame = frame.sort_values("score", key=np.abs, ascending=False).reset_index(drop=True)
    frame["rank"] = np.arange(1, len(frame) + 1)
    return frame


def head_sets(
    runs: Runs,
    singles: pd.DataFrame,
    top_heads: list[tuple[int, int]],
    cfg: InterventionsConfig,
    model_cfg,
    base_seed: int,
) -> pd.DataFrame:
    """Pairs, triplets, ... among `top_heads`, and random head sets of each size (control)."""
    single = {(int(r.layer), int(r.head)): r.score for r in singles.itertuples()}
    all_heads = [(n.layer, n.index) for n in head_nodes(model_cfg.n_layers, model_cfg.n_heads)]
    sets: list[tuple[str, tuple]] = []
    for size in range(2, cfg.max_set_size + 1):
        sets += [("top_k", combo) for combo in itertools.combinations(top_heads, size)]
        if size <= len(all_heads):
            for draw in range(cfg.n_random_sets):
                rng = np.random.default_rng([base_seed, size, draw, 29])
                pick = sorted(rng.choice(len(all_heads), size, replace=False))
                sets.append(("random", tuple(all_heads[i] for i in pick)))
    rows = []
    for kind, combo in sets:
        nodes = [Node("head", layer, head) for layer, head in combo]
        eff = runs.effect(nodes, cfg.ci_level)
        additive = float(sum(single[h] for h in combo))
        rows.append(
            {
                "set": kind,
                "size": len(combo),
                "heads": "+".join(head_label(*h) for h in combo),
                "layer": [h[0] for h in combo],
                "head": [h[1] for h in combo],
            }
            | eff
            | {"additive": additive, "interaction": eff["score"] - additive}
        )
    columns = ["set", "size", "heads", "layer", "head", "score", "score_std", "additive"]
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)
    return frame


def heads_across_behaviours(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Single-head ablation effects of every behaviour in one long table; `specificity` is a
    head's drop_frac on this behaviour minus its mean drop_frac on the others."""
    frames = []
    for behaviour, t in tables.items():
        cols = ["layer", "head", "score", "score_std", "drop_frac", "drop_frac_std"]
        cols += ["accuracy_change", "accuracy_change_std", "attribution_score"]
        frames.append(t[[c for c in cols if c in t]].assign(behaviour=behaviour))
    frame = pd.concat(frames, ignore_index=True)
    total = frame.groupby(["layer", "head"])["drop_frac"].transform("sum")
    count = frame.groupby(["layer", "head"])["drop_frac"].transform("count")
    others = (total - frame["drop_frac"]) / (count - 1).where(count > 1)
    frame["specificity"] = frame["drop_frac"] - others
    order = ["behaviour", "layer", "head"]
    return frame[order + [c for c in frame if c not in order]].sort_values(order)


# --- features ---------------------------------------------------------------------------------
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
    feats = feats[[sae_hook(r.site, int(r.layer)) in saes for r in feats.itertuples()]]
    feats = feats.reindex(feats["score"].abs().sort_values(ascending=False).index)
    top = feats.head(cfg.n_features)
    iv = runs.iv
    rows = []
    for r in top.itertuples():
        node = Node("feature", int(r.layer), int(r.feature), r.site)
        rows.append(
            {"site": r.site, "layer": int(r.layer), "feature": int(r.feature), "set": "top"}
            | runs.effect([node], cfg.ci_level)
            | {"attribution_score": float(r.score)}
        )
    attr_score = {
        (r.site, int(r.layer), int(r.feature)): float(r.score) for r in feats.itertuples()
    }
    for site, layer in sorted({(r.site, int(r.layer)) for r in top.itertuples()}):
        hook = sae_hook(site, layer)
        pool = np.setdiff1d(active_features(iv, hook), top["feature"].astype(int).to_numpy())
        rng = np.random.default_rng([base_seed, layer, 31])
        pick = rng.choice(pool, min(cfg.n_random_features, len(pool)), replace=False)
        for f in sorted(int(x) for x in pick):
            node = Node("feature", layer, f, site)
            rows.append(
                {"site": site, "layer": layer, "feature": f, "set": "random"}
                | runs.effect([node], cfg.ci_level)
                | {"attribution_score": attr_score.get((site, layer, f), np.nan)}
            )
    ablate = pd.DataFrame(rows) if rows else empty_ablate

    steer_rows = []
    base = runs.base
    for r in top.itertuples():
        site, layer, f = r.site, int(r.layer), int(r.feature)
        hook = sae_hook(site, layer)
        direction = saes[hook].W_dec[f].detach().float().cpu()
        g = torch.Generator().manual_seed(base_seed * 100003 + layer * 1009 + f)
        rand = torch.randn(direction.shape, generator=g)
        rand = rand / rand.norm() * direction.norm()
        for kind, vec in (("feature", direction), ("random", rand)):
            for alpha in cfg.steering_alphas:
                out = (
                    base
                    if alpha == 0
                    else runs.iv.run((), seed=runs.seeds[0], steer=[(hook, alpha * vec)])
                )
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


# --- the stage --------------------------------------------------------------------------------
def run_stage(
    model,
    prompts: pd.DataFrame,
    attribution_dir: Path | str,
    saes: dict[str, Any],
    tokenizer: Any,
    cfg: InterventionsConfig,
    behaviour: str,
    out_dir: Path | str,
    base_seed: int = 0,
) -> dict[str, Any]:
    """Write circuits.parquet, heads.parquet, head_sets.parquet, features.parquet,
    steering.parquet, the figures and summary.json (last) into `out_dir`."""
    import json

    from circuitflow import plots_interventions as plots
    from circuitflow.io import save_figure, write_json, write_parquet

    t0 = time.perf_counter()
    out = Path(out_dir)
    attr_dir = Path(attribution_dir)
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    prompts = prompts.reset_index(drop=True)

    def read(name: str) -> pd.DataFrame | None:
        path = attr_dir / name
        return pd.read_parquet(path) if path.is_file() else None

    attr_heads, components, attr_features = (
        read("heads.parquet"),
        read("components.parquet"),
        read("features.parquet"),
    )
    graph_path = attr_dir / "graph.json"
    graph = json.loads(graph_path.read_text()) if graph_path.is_file() else None

    seeds = seeds_for(cfg, base_seed)
    iv = Intervener(model, prompts, cfg.ablation, cfg.mean_reference, cfg.batch_size, saes)
    runs = Runs(iv, seeds)
    mc = model.cfg

    # Circuits over the nodes, ranked by attribution.
    active = None
    if components is not None and len(components):
        if cfg.circuit_nodes == "features" and saes:
            active = {sae_site_layer(h): active_features(iv, h) for h in saes}
        ranked = ranked_nodes(components, attr_features, active)
    else:
        ranked = component_nodes(mc.n_layers, mc.n_heads)
    claimed = graph_nodes(graph, ranked)
    sizes = circuit_sizes(len(ranked), cfg, [cfg.circuit_size])
    curves = circuit_curves(runs, ranked, sizes, cfg, base_seed, named=claimed)
    curves = refine_smallest(runs, ranked, curves, cfg, base_seed)
    smallest = smallest_faithful(curves, cfg.faithfulness_threshold)
    size = cfg.circuit_size if cfg.circuit_size is not None else smallest
    size = min(size, len(ranked)) if size is not None else len(ranked)
    t_circuits = time.perf_counter() - t0

    singles = single_heads(runs, mc, attr_heads, cfg.ci_level)
    if attr_heads is not None and len(attr_heads):
        order = attr_heads.reindex(attr_heads["score"].abs().sort_values(ascending=False).index)
        top_heads = [(int(r.layer), int(r.head)) for r in order.head(cfg.top_k_heads).itertuples()]
    else:
        top_heads = [
            (int(r.layer), int(r.head)) for r in singles.head(cfg.top_k_heads).itertuples()
        ]
    sets = head_sets(runs, singles, top_heads, cfg, mc, base_seed)
    t_heads = time.perf_counter() - t0 - t_circuits

    feat_ablate, steering = feature_interventions(
        runs, attr_features, saes, tokenizer, cfg, base_seed
    )
    t_total = time.perf_counter() - t0

    for frame in (curves, singles, sets, feat_ablate, steering):
        frame.insert(0, "ablation", cfg.ablation)
    write_parquet(out / "circuits.parquet", curves)
    write_parquet(out / "heads.parquet", singles)
    write_parquet(out / "head_sets.parquet", sets)
    write_parquet(out / "features.parquet", feat_ablate)
    write_parquet(out / "steering.parquet", steering)

    title = f"{behaviour} ({cfg.ablation} ablation)"
    save_figure(
        out / "faithfulness.png", plots.circuit_curves(curves, cfg.faithfulness_threshold, title)
    )
    save_figure(out / "heads.png", plots.head_heatmap(singles, mc.n_layers, mc.n_heads, title))
    save_figure(out / "head_sets.png", plots.head_sets(sets, title))
    save_figure(out / "steering.png", plots.steering(steering, title))

    top = curves[curves["circuit"] == "top"].drop_duplicates("n").set_index("n")
    band_f, band_c = random_band(curves, "faithfulness"), random_band(curves, "completeness")

    def band(b: pd.DataFrame, n: int | None) -> float | None:
        return float(b.loc[n, "mean"]) if n is not None and n in b.index else None

    summary = {
        "behaviour": behaviour,
        "ablation": cfg.ablation,
        "mean_reference": cfg.mean_reference if cfg.ablation == "mean" else None,
        "metric": METRIC,
        "n_prompts": len(prompts),
        "seeds": seeds,
        "logit_diff_clean": float(runs.base.logit_diff.mean()),
        "logit_diff_empty": float(top["m_empty"].iloc[0]),
        "accuracy_clean": float(runs.base.correct.mean()),
        "circuit_nodes": CIRCUIT_NODE_TEXT[cfg.circuit_nodes if active else "components"],
        "n_nodes": len(ranked),
        "n_nodes_by_kind": count_kinds(ranked),
        "circuit_size": int(size),
        "circuit_size_source": "config" if cfg.circuit_size is not None else "smallest faithful",
        "circuit": [node.id for node in ranked[:size]],
        "faithfulness": float(top.loc[size, "faithfulness"]),
        "faithfulness_std": float(top.loc[size, "faithfulness_std"]),
        "completeness": float(top.loc[size, "completeness"]),
        "completeness_std": float(top.loc[size, "completeness_std"]),
        "random_faithfulness": band(band_f, size),
        "random_completeness": band(band_c, size),
        "faithfulness_threshold": cfg.faithfulness_threshold,
        "smallest_faithful_size": smallest,
        "smallest_faithful_circuit": None
        if smallest is None
        else [node.id for node in ranked[:smallest]],
        "smallest_faithful_fraction": None if smallest is None else smallest / len(ranked),
        "smallest_faithful_by_kind": None if smallest is None else count_kinds(ranked[:smallest]),
        "random_faithfulness_at_smallest": band(band_f, smallest),
        "graph_circuit": graph_summary(curves),
        "faithfulness_curve": {int(n): float(v) for n, v in top["faithfulness"].items()},
        "completeness_curve": {int(n): float(v) for n, v in top["completeness"].items()},
        "top_heads": singles.head(5)[["layer", "head", "score", "drop_frac"]].to_dict("records"),
        "top_k_heads": [head_label(*h) for h in top_heads],
        "n_runs": runs.n_runs,
        "config": asdict(cfg),
        "seconds": {
            "circuits": t_circuits,
            "heads": t_heads,
            "features": t_total - t_circuits - t_heads,
            "total": t_total,
        },
    }
    write_json(out / "summary.json", summary)  # last: the rule's main output
    log.info(
        "%s: faithfulness %.3f, completeness %.3f at n=%d; smallest faithful n=%s; %d runs, %.1f s",
        behaviour,
        summary["faithfulness"],
        summary["completeness"],
        size,
        smallest,
        runs.n_runs,
        t_total,
    )
    return summary
