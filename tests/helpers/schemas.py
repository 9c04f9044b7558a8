"""Checks of the output contracts (graph.json, the interventions tables and summary) that the
unit tests and the whole-DAG tests both apply."""

from __future__ import annotations

import json

import pandas as pd

from circuitflow.attribution.methods import REGISTRY


def check_graph_schema(graph: dict) -> None:
    kinds = {"embedding", "head", "mlp", "feature", "error", "logit"}
    ids = set()
    for n in graph["nodes"]:
        assert {"id", "kind", "layer", "index", "score"} <= set(n)
        assert n["kind"] in kinds and isinstance(n["layer"], int) and isinstance(n["score"], float)
        ids.add(n["id"])
    assert "logit" in ids
    for e in graph["edges"]:
        assert e["source"] in ids and e["target"] in ids and isinstance(e["weight"], float)
    assert {"node_threshold", "edge_threshold"} <= set(graph["thresholds"])
    assert graph["method"] in REGISTRY
    # Every computed edge, before pruning (graph.html re-prunes from them).
    computed = {(e["source"], e["target"]) for e in graph["computed_edges"]}
    assert len(graph["computed_edges"]) == graph["n_edges_computed"]
    assert {(e["source"], e["target"]) for e in graph["edges"]} <= computed


HEAD_COLUMNS = {
    "ablation", "layer", "head", "score", "score_std", "score_ci_low", "score_ci_high",
    "p_value", "drop_frac", "drop_frac_std", "logit_diff", "accuracy", "accuracy_change",
    "accuracy_change_std", "calibration_error", "calibration_error_change",
    "attribution_score", "rank",
}  # fmt: skip
CIRCUIT_COLUMNS = {
    "ablation", "circuit", "n", "draw", "faithfulness", "faithfulness_std", "completeness",
    "completeness_std", "faithfulness_heldout", "faithfulness_heldout_std",
    "completeness_heldout", "completeness_heldout_std", "m_circuit", "m_complement", "m_full",
    "m_empty", "nodes",
}  # fmt: skip
SET_COLUMNS = {"ablation", "set", "size", "heads", "layer", "head", "score", "score_std",
               "drop_frac", "additive", "interaction", "accuracy_change"}  # fmt: skip
FEATURE_COLUMNS = {"ablation", "site", "layer", "feature", "set", "score", "score_std",
                   "drop_frac", "attribution_score"}  # fmt: skip
STEER_COLUMNS = {"ablation", "site", "layer", "feature", "direction", "alpha", "logit_diff",
                 "logit_diff_change", "accuracy", "top1_changed", "top_tokens",
                 "top_token_logit_change", "decoder_norm"}  # fmt: skip
SUMMARY_KEYS = {
    "behaviour", "ablation", "faithfulness", "completeness", "circuit_size", "circuit",
    "smallest_faithful_size", "faithfulness_threshold", "random_faithfulness",
    "random_completeness", "faithfulness_curve", "completeness_curve", "seeds", "n_prompts",
    "logit_diff_clean", "logit_diff_empty", "top_heads", "seconds", "circuit_nodes", "n_nodes",
    "n_nodes_by_kind", "smallest_faithful_fraction", "smallest_faithful_by_kind",
    "random_faithfulness_at_smallest", "graph_circuit", "faithfulness_heldout",
    "completeness_heldout", "faithfulness_auc", "faithfulness_auc_selection",
    "faithfulness_curve_heldout", "completeness_curve_heldout", "n_prompts_selection",
    "n_prompts_heldout", "random_faithfulness_heldout", "random_completeness_heldout",
    "component_circuit", "ablation_circuit", "patching_circuit", "ablation_scores_validation",
    "inert_heads", "no_difference_heads", "left_out_heads",
}  # fmt: skip
VIEW_KEYS = {"view", "judged_by", "ranked_by", "candidates", "smallest_prefix", "size", "nodes",
             "by_kind", "faithfulness", "faithfulness_heldout", "completeness",
             "completeness_heldout", "cpr", "cmd", "cpr_selection", "cmd_selection",
             "pruning"}  # fmt: skip
ABLATION_SCORE_COLUMNS = {"ablation", "node", "kind", "layer", "index", "ablation_score",
                          "ablation_score_selection", "ablation_score_exact",
                          "ablation_score_exact_selection", "ablation_score_source"}  # fmt: skip


def check_outputs(d, n_layers: int, n_heads: int, with_features: bool = True) -> dict:
    """Schemas of one behaviour's interventions directory; returns summary.json."""
    summary = json.loads((d / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary), SUMMARY_KEYS - set(summary)
    heads = pd.read_parquet(d / "heads.parquet")
    assert HEAD_COLUMNS <= set(heads.columns), HEAD_COLUMNS - set(heads.columns)
    assert len(heads) == n_layers * n_heads
    assert (heads["ablation"] == summary["ablation"]).all()
    circuits = pd.read_parquet(d / "circuits.parquet")
    assert CIRCUIT_COLUMNS <= set(circuits.columns)
    assert {"top", "random"} <= set(circuits["circuit"]) <= {"top", "random", "graph"}
    components = pd.read_parquet(d / "component_circuits.parquet")
    assert CIRCUIT_COLUMNS <= set(components.columns)
    assert set(components["circuit"]) <= {"top", "random", "graph"}
    kinds = {n.split(".")[0] for nodes in components["nodes"] for n in nodes}
    assert kinds <= {"embedding", "head", "mlp"}, kinds
    for key in ("ablation_circuit", "patching_circuit", "component_ablation_circuit",
                "component_patching_circuit"):  # fmt: skip
        assert VIEW_KEYS <= set(summary[key]), VIEW_KEYS - set(summary[key])
    scores = pd.read_parquet(d / "ablation_scores.parquet")
    assert ABLATION_SCORE_COLUMNS <= set(scores.columns), ABLATION_SCORE_COLUMNS - set(scores)
    views = pd.read_parquet(d / "circuit_views.parquet")
    assert CIRCUIT_COLUMNS <= set(views.columns) and {"view", "judged_by"} <= set(views.columns)
    assert set(views["view"]) <= {"ablation", "patching"}
    assert set(views["candidates"]) <= {"configured", "components"}
    assert set(views["circuit"]) <= {"top", "pruned"}
    sets = pd.read_parquet(d / "head_sets.parquet")
    assert SET_COLUMNS <= set(sets.columns)
    assert set(sets["set"]) == {"top_k", "random"} and set(sets["size"]) == {2, 3}
    if with_features:
        feats = pd.read_parquet(d / "features.parquet")
        assert FEATURE_COLUMNS <= set(feats.columns) and set(feats["set"]) == {"top", "random"}
        steer = pd.read_parquet(d / "steering.parquet")
        assert STEER_COLUMNS <= set(steer.columns)
        assert set(steer["direction"]) == {"feature", "random"}
        zero = steer[steer["alpha"] == 0]
        assert (zero["logit_diff_change"].abs() < 1e-9).all()
    for png in ("faithfulness.png", "heads.png", "head_sets.png", "steering.png"):
        assert (d / png).stat().st_size > 1000
    return summary
