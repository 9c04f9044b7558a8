"""What the interventions stage tests: the circuit (candidates ranked by their score against the
run's ablation on the selection half, the curves over circuit sizes, the smallest faithful size,
beside a circuit of features the component circuit, and the two views, ablation and patching,
each pruned to a minimal faithful circuit) and the heads whose pairs and triplets it ablates
(the top heads by attribution, heads inert and carrying no difference left out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from circuitflow.interventions import circuits as circ
from circuitflow.interventions import features as feat
from circuitflow.interventions.ablation import PATCH
from circuitflow.interventions.ablation_scores import AblationScores, ablation_scores
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.inputs import AttributionResults
from circuitflow.interventions.pruning import Pruned, prune
from circuitflow.interventions.stats import Runs
from circuitflow.nodes import component_nodes, site_layer


@dataclass
class Circuits:
    curves: pd.DataFrame
    ranked: list  # candidate nodes by |ablation score| on the selection half (ablation_scores)
    size: int | None  # the circuit size reported; None when no size is faithful
    smallest: int | None  # the smallest faithful size (selection half)
    features_as_nodes: bool
    selection: Any  # mask over prompts: the selection half
    component_curves: pd.DataFrame  # the curves over the components alone
    component_ranked: list  # the components by |ablation score| on the selection half
    views: Views | None = None  # the ablation and patching circuits, pruned
    component_views: Views | None = None  # the same over the components alone (with features)


def circuits(
    runs: Runs,
    attr: AttributionResults,
    saes: dict[str, Any],
    cfg: InterventionsConfig,
    model_cfg,
    base_seed: int,
    selection,
) -> Circuits:
    """Candidates ranked by their score against the run's ablation on the selection half
    (ablation_scores, `cfg.circuit_scores`), the curves over circuit sizes, the smallest
    faithful size on the selection half (grid, then bisection) and the attribution graph's own
    node set as a circuit; beside a circuit of features, the same over the components alone
    (the component circuit); and both views (circuit_views): the ablation circuit and the
    patching circuit, each pruned to a minimal faithful circuit."""
    universe = candidates(attr, saes, cfg, model_cfg, runs.iv)
    features_as_nodes = any(node.kind in ("feature", "error") for node in universe)
    scores = ablation_scores(
        runs, saes, selection, cfg.circuit_scores, cfg.circuit_ig_steps,
        bypass_bos=runs.iv.bypass_bos,
    )  # fmt: skip
    ranked = scores.ranked(universe)
    claimed = circ.graph_nodes(attr.graph, ranked)
    sizes = circ.circuit_sizes(len(ranked), cfg, [cfg.circuit_size])
    curves = circ.circuit_curves(runs, ranked, sizes, cfg, base_seed, selection, named=claimed)
    curves = circ.refine_smallest(runs, ranked, curves, cfg, base_seed, selection)
    smallest = circ.smallest_faithful(curves, cfg.faithfulness_threshold)
    size = cfg.circuit_size if cfg.circuit_size is not None else smallest
    size = min(size, len(ranked)) if size is not None else None
    comp_ranked, comp_curves = ranked, curves
    if features_as_nodes:  # features are candidates: the component circuit is a second search
        comp_ranked = [node for node in ranked if node.kind not in ("feature", "error")]
        sizes = circ.circuit_sizes(len(comp_ranked), cfg, [])
        # Random controls at the size it finds only (refine_smallest): no figure draws this
        # search's curves.
        comp_curves = circ.circuit_curves(
            runs, comp_ranked, sizes, cfg, base_seed, selection, controls=False
        )
        comp_curves = circ.refine_smallest(
            runs, comp_ranked, comp_curves, cfg, base_seed, selection
        )
    views = circuit_views(runs, attr, cfg, base_seed, selection, universe, scores)
    comp_views = None
    if features_as_nodes:
        components = [node for node in universe if node.kind not in ("feature", "error")]
        comp_views = circuit_views(runs, attr, cfg, base_seed, selection, components, scores)
    return Circuits(
        curves, ranked, size, smallest, features_as_nodes, selection, comp_curves.copy(),
        comp_ranked, views, comp_views,
    )  # fmt: skip


@dataclass
class Search:
    """One circuit search: candidates ranked by one score and judged by one counterfactual.
    `view` is `ablation` ("what the behaviour needs": ranked by the score against the run's
    ablation, judged by that ablation) or `patching` ("what carries the difference": ranked by
    attribution against the corrupted prompt, judged by patching from it, ablation.PATCH).
    `curves` holds the top-n rows (grid and bisection, no random controls) and the pruned
    circuit's row (`circuit` = pruned), each on both halves; `cpr`, `cmd` are MIB's areas of
    the top-n curve held out (circuits.cpr_cmd), `*_selection` on the selection half."""

    view: str
    judged_by: str  # the ablation kind (zero, mean, resample) or patch
    ranked_by: str  # the score column the candidates are ranked by
    ranked: list
    curves: pd.DataFrame
    smallest: int | None  # the smallest faithful top-n prefix (selection half)
    pruned: Pruned | None  # None when no prefix is faithful
    cpr: float
    cmd: float
    cpr_selection: float
    cmd_selection: float

    @property
    def nodes(self) -> list | None:
        """The reported circuit: the minimal faithful one pruning found."""
        return None if self.pruned is None else self.pruned.nodes

    def row(self, circuit: str = "pruned") -> pd.Series | None:
        rows = self.curves[self.curves["circuit"] == circuit]
        return None if rows.empty else rows.iloc[0]


def search(
    runs: Runs,
    ranked: list,
    cfg: InterventionsConfig,
    base_seed: int,
    selection,
    view: str,
    ranked_by: str,
) -> Search:
    """The top-n curves of `ranked` judged by `runs`' ablation, the smallest faithful prefix on
    the selection half (grid, then bisection), pruned (pruning.prune, `cfg.prune_rounds` rounds
    at most) to a minimal faithful circuit, which is then scored on both halves."""
    sizes = circ.circuit_sizes(len(ranked), cfg, [])
    curves = circ.circuit_curves(runs, ranked, sizes, cfg, base_seed, selection, controls=False)
    curves = circ.refine_smallest(runs, ranked, curves, cfg, base_seed, selection)
    curves = curves[curves["circuit"] == "top"]
    smallest = circ.smallest_faithful(curves, cfg.faithfulness_threshold)
    pruned = None
    if smallest is not None:
        with runs.iv.counter.part("pruning"):  # its own part: the plan charges its worst case
            pruned = prune(
                runs, ranked, ranked[:smallest], selection, cfg.faithfulness_threshold,
                batch=cfg.runs_per_pass, max_rounds=cfg.prune_rounds, max_nodes=cfg.prune_max_nodes,
            )  # fmt: skip
        row = circ.circuit_curves(
            runs, ranked, [], cfg, base_seed, selection, named=pruned.nodes, controls=False,
            named_as="pruned",
        )  # fmt: skip
        curves = pd.concat([curves, row], ignore_index=True)
    top = curves[curves["circuit"] == "top"].drop_duplicates("n")
    areas = {
        half: circ.cpr_cmd(
            dict(zip(top["n"], top[f"faithfulness{half}"], strict=True)), len(ranked)
        )
        for half in ("", "_heldout")
    }
    return Search(
        view, runs.iv.kind, ranked_by, list(ranked), curves.reset_index(drop=True), smallest,
        pruned, *areas["_heldout"], *areas[""],
    )  # fmt: skip


@dataclass
class Views:
    """The two circuits of a behaviour: what it needs (`ablation`) and what carries the
    clean/corrupted difference (`patching`), over the same candidates, with the ablation
    scores the first is ranked by."""

    ablation: Search
    patching: Search | None  # None without attribution's patching scores
    scores: AblationScores


def candidates(attr: AttributionResults, saes: dict[str, Any], cfg, model_cfg, iv) -> list:
    """The circuit candidates of `circuits` (components; with circuit_nodes features and SAEs,
    the features that fire and the error terms too), ranked by attribution's patching score
    (forward order without attribution)."""
    if attr.components is not None and len(attr.components):
        active = None
        if cfg.circuit_nodes == "features" and saes:
            active = {site_layer(h): feat.active_features(iv, h) for h in saes}
        return circ.ranked_nodes(attr.components, attr.features, active)
    mlps = not getattr(model_cfg, "attn_only", False)
    return component_nodes(model_cfg.n_layers, model_cfg.n_heads, mlps)


def circuit_views(
    runs: Runs,
    attr: AttributionResults,
    cfg: InterventionsConfig,
    base_seed: int,
    selection,
    universe: list,
    scores: AblationScores,
) -> Views:
    """Both views over the same candidates `universe`: the ablation circuit, ranked by the
    nodes' `scores` against the run's ablation and judged by that ablation; the patching
    circuit, ranked by attribution's patching score (the order of `universe`, `candidates`) and
    judged by patching from the corrupted prompt (none without attribution's scores). Each is
    pruned to a minimal faithful circuit on the selection half and scored on the held-out
    half."""
    need = search(
        runs, scores.ranked(universe), cfg, base_seed, selection, "ablation",
        f"ablation_score_selection ({scores.method}, exact where run)",
    )  # fmt: skip
    carry = None
    if attr.components is not None and len(attr.components):
        patch = Runs(runs.iv.with_kind(PATCH), runs.seeds)
        carry = search(
            patch, universe, cfg, base_seed, selection, "patching", "score_selection (attribution)",
        )  # fmt: skip
        runs.n_runs += patch.n_runs
    return Views(need, carry, scores)


def _scored_heads(attr: AttributionResults, singles: pd.DataFrame) -> pd.DataFrame:
    """Heads with the score that picks the top heads: attribution's (the ablation effect when
    attribution has none)."""
    return attr.heads if attr.heads is not None and len(attr.heads) else singles


def inert_heads(singles: pd.DataFrame) -> list[tuple[int, int]]:
    """Heads whose own ablation (the run's ablation, each head alone: heads.single_heads) has
    no effect: the t-interval of its effect over prompts covers 0 (an effect of exactly 0, such
    as a pruned head's, W_O = 0, included). A head that carries no clean/corrupted difference
    can still be needed (no_difference_heads)."""
    rows = singles[(singles["score_ci_low"] <= 0) & (singles["score_ci_high"] >= 0)]
    return sorted((int(r.layer), int(r.head)) for r in rows.itertuples())


def no_difference_heads(attr: AttributionResults) -> list[tuple[int, int]]:
    """Heads whose attribution score against the corrupted prompt is exactly 0: patching them
    from the corrupted prompt changes nothing, so they carry no clean/corrupted difference
    (they may still be needed: inert_heads)."""
    heads = attr.heads
    if heads is None or not len(heads):
        return []
    return sorted((int(r.layer), int(r.head)) for r in heads[heads["score"] == 0].itertuples())


def untestable_heads(attr: AttributionResults, singles: pd.DataFrame) -> list[tuple[int, int]]:
    """Heads both inert and carrying no difference (or inert, without attribution): nothing
    says they do anything, so their pairs and triplets would only repeat the sets without
    them."""
    inert = set(inert_heads(singles))
    if attr.heads is None or not len(attr.heads):
        return sorted(inert)
    return sorted(inert & set(no_difference_heads(attr)))


def top_heads(attr: AttributionResults, singles: pd.DataFrame, k: int) -> list[tuple[int, int]]:
    """The k heads by |attribution score| (by ablation effect when attribution has none; ties
    by ablation effect), untestable heads left out."""
    heads = _scored_heads(attr, singles)
    score = {(int(r.layer), int(r.head)): abs(float(r.score)) for r in heads.itertuples()}
    effect = {(int(r.layer), int(r.head)): abs(float(r.score)) for r in singles.itertuples()}
    skip = set(untestable_heads(attr, singles))
    ranked = sorted(score, key=lambda h: (-score[h], -effect.get(h, 0.0), h))
    return [h for h in ranked if h not in skip][:k]
