"""The interventions stage's summary.json (every number from the tables the stage wrote, with
the flags on its headline numbers) and `headline`, the script's one line about it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pandas as pd

from circuitflow.interventions import circuits as circ
from circuitflow.interventions import flags
from circuitflow.interventions import heads as hd
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.selection import Circuits, Search
from circuitflow.interventions.stats import Runs

METRIC = "logit_diff (answer - distractor, last position), mean over prompts"


def summarise(
    behaviour: str,
    cfg: InterventionsConfig,
    runs: Runs,
    c: Circuits,
    singles: pd.DataFrame,
    top: list[tuple[int, int]],
    n_prompts: int,
    seconds: dict[str, float],
    heads: dict[str, list[tuple[int, int]]] | None = None,
) -> dict[str, Any]:
    """summary.json (every number from the tables the stage wrote), with the flags on its
    headline numbers (flags.py). `heads`: `inert` (own ablation without effect),
    `no_difference` (attribution score exactly 0) and `left_out` (both: left out of the top
    heads)."""
    heads = heads or {}
    curves, ranked, size, smallest = c.curves, c.ranked, c.size, c.smallest
    top_rows = curves[curves["circuit"] == "top"].drop_duplicates("n").set_index("n")

    def at(n: int | None, column: str) -> float | None:
        return float(top_rows.loc[n, column]) if n is not None else None

    def band(column: str, n: int | None) -> float | None:
        b = circ.random_band(curves, column)
        return float(b.loc[n, "mean"]) if n is not None and n in b.index else None

    def nodes(n: int | None) -> list[str] | None:
        return None if n is None else [node.id for node in ranked[:n]]

    undefined = undefined_metrics(top_rows)
    if cfg.circuit_size is not None:
        source = "config"
    elif smallest is not None:
        source = "smallest faithful on the selection half"
    elif "faithfulness" in undefined:
        source = f"none: faithfulness is undefined ({undefined['faithfulness']})"
    else:
        source = (
            f"none: no circuit size reaches faithfulness {cfg.faithfulness_threshold} on the "
            "selection half"
        )
    summary = {
        "behaviour": behaviour,
        "ablation": cfg.ablation,
        "mean_reference": cfg.mean_reference if cfg.ablation == "mean" else None,
        "metric": METRIC,
        "n_prompts": n_prompts,
        "n_prompts_selection": int(c.selection.sum()),
        "n_prompts_heldout": int((~c.selection).sum()),
        "seeds": runs.seeds,
        "logit_diff_clean": float(runs.base.logit_diff.mean()),
        "logit_diff_empty": float(top_rows["m_empty"].iloc[0]),
        "accuracy_clean": float(runs.base.correct.mean()),
        "circuit_nodes": circ.CIRCUIT_NODE_TEXT[
            cfg.circuit_nodes if c.features_as_nodes else "components"
        ],
        "n_nodes": len(ranked),
        "n_nodes_by_kind": circ.count_kinds(ranked),
        "circuit_size": size,
        "circuit_size_source": source,
        "circuit": nodes(size),
    }
    for half in ("", "_heldout"):
        for metric in ("faithfulness", "completeness"):
            summary[f"{metric}{half}"] = at(size, f"{metric}{half}")
            summary[f"{metric}{half}_std"] = at(size, f"{metric}{half}_std")
            summary[f"random_{metric}{half}"] = band(f"{metric}{half}", size)
    summary |= {
        "faithfulness_auc": circ.faithfulness_auc(curves, len(ranked), "faithfulness_heldout"),
        "faithfulness_auc_selection": circ.faithfulness_auc(curves, len(ranked), "faithfulness"),
        "faithfulness_threshold": cfg.faithfulness_threshold,
        "smallest_faithful_size": smallest,
        "smallest_faithful_circuit": nodes(smallest),
        "smallest_faithful_fraction": None if smallest is None else smallest / len(ranked),
        "smallest_faithful_by_kind": None
        if smallest is None
        else circ.count_kinds(ranked[:smallest]),
        "random_faithfulness_at_smallest": band("faithfulness", smallest),
        "graph_circuit": circ.graph_summary(curves),
        "component_circuit": circ.component_summary(
            c.component_curves, c.component_ranked, cfg.faithfulness_threshold
        ),
        # By ablation effect; heads whose ablation changes nothing at all are left out.
        "top_heads": singles[singles["score"] != 0]
        .head(5)[["layer", "head", "score", "drop_frac"]]
        .to_dict("records"),
        "top_k_heads": [hd.head_label(*h) for h in top],
        "ablation_circuit": view_summary(c.views.ablation if c.views else None),
        "patching_circuit": view_summary(c.views.patching if c.views else None),
        "component_ablation_circuit": view_summary(
            (c.component_views or c.views).ablation if c.views else None
        ),
        "component_patching_circuit": view_summary(
            (c.component_views or c.views).patching if c.views else None
        ),
        "ablation_scores_validation": c.views.scores.validation if c.views else None,
        "inert_heads": [hd.head_label(*h) for h in heads.get("inert", [])],
        "no_difference_heads": [hd.head_label(*h) for h in heads.get("no_difference", [])],
        "left_out_heads": [hd.head_label(*h) for h in heads.get("left_out", [])],
        "n_runs": runs.n_runs,
        "config": asdict(cfg),
        "seconds": seconds,
        "undefined": undefined,
    }
    for column in ("faithfulness", "completeness", "faithfulness_heldout", "completeness_heldout"):
        curve = {int(n): float(v) for n, v in top_rows[column].items()}
        summary[column.replace("ness", "ness_curve", 1)] = curve
    return flags.with_flags(summary)


def undefined_metrics(top_rows: pd.DataFrame) -> dict[str, str]:
    """Each metric whose curve is undefined at every size, and why: faithfulness and
    completeness divide by m_full - m_empty, which is 0 when ablating every candidate node
    leaves the metric where it was (a metric the same for every input, such as a model whose
    logits do not depend on it). Empty when the curves are numbers."""
    out = {}
    full, empty = float(top_rows["m_full"].iloc[0]), float(top_rows["m_empty"].iloc[0])
    for half, where in (("", "the selection half"), ("_heldout", "the held-out half")):
        for metric in circ.METRICS:
            if top_rows[f"{metric}{half}"].isna().all():
                out[f"{metric}{half}"] = (
                    f"ablating every node leaves the metric where it was on {where} "
                    f"(m_full - m_empty = 0; m_full {full:.4g}, m_empty {empty:.4g} on the "
                    "selection half): the metric does not depend on the nodes"
                )  # fmt: skip
    return out


VIEW_TEXT = {
    "ablation": "what the behaviour needs: ranked by each node's score against the run's "
    "ablation, judged by that ablation",
    "patching": "what carries the clean/corrupted difference: ranked by attribution against "
    "the corrupted prompt, judged by patching every node outside it from the corrupted prompt",
}


def view_summary(view: Search | None) -> dict[str, Any] | None:
    """summary.json's `ablation_circuit` or `patching_circuit`: the minimal faithful circuit
    pruning found (selection.Search), its faithfulness and completeness on both halves, the
    smallest faithful prefix it was pruned from, MIB's CPR and CMD of the top-n curve (held
    out, and on the selection half) and what pruning cost."""
    if view is None:
        return None
    out: dict[str, Any] = {
        "view": VIEW_TEXT[view.view],
        "judged_by": view.judged_by,
        "ranked_by": view.ranked_by,
        "candidates": len(view.ranked),
        "smallest_prefix": view.smallest,
        "cpr": view.cpr,
        "cmd": view.cmd,
        "cpr_selection": view.cpr_selection,
        "cmd_selection": view.cmd_selection,
    }
    p, row = view.pruned, view.row()
    out |= {
        "size": None if p is None else len(p.nodes),
        "nodes": None if p is None else [node.id for node in p.nodes],
        "by_kind": None if p is None else circ.count_kinds(p.nodes),
    }
    for half in ("", "_heldout"):
        for metric in circ.METRICS:
            for std in ("", "_std"):
                column = f"{metric}{half}{std}"
                out[column] = None if row is None else float(row[column])
    out["pruning"] = None
    if p is not None:
        out["pruning"] = {
            "removed": p.removed,
            "necessity": p.necessity,
            "rounds": p.rounds,
            "converged": p.converged,
            "skipped": p.skipped,
            "runs": p.runs,
            "bound_runs": p.bound_runs,
        }
    return out


def _fmt(x: Any, spec: str = ".3f") -> str:
    """A summary number for the headline; `none` where the summary has none (no faithful
    circuit size: the metrics at it are null)."""
    return "none" if x is None else format(x, spec)


def headline(behaviour: str, s: dict[str, Any]) -> str:
    """The script's one line about a summary: the component circuit's faithfulness, the
    circuit's faithfulness and completeness (or that no size is faithful), the top head drops
    and how many flags summary.json raises."""
    heads = ", ".join(
        f"L{h['layer']}H{h['head']} {_fmt(h['drop_frac'], '.0%')}" for h in s["top_heads"][:3]
    )
    undefined = s.get("undefined") or {}
    if s["circuit_size"] is None and "faithfulness" in undefined:
        circuit = f"faithfulness undefined: {undefined['faithfulness']}"
    elif s["circuit_size"] is None:
        circuit = (
            f"no circuit size reaches faithfulness {s['faithfulness_threshold']} on the "
            "selection half"
        )
    else:
        circuit = (
            f"faithfulness {_fmt(s['faithfulness'])} (held out "
            f"{_fmt(s['faithfulness_heldout'])}), completeness {_fmt(s['completeness'])} at "
            f"n={s['circuit_size']}; smallest faithful n={s['smallest_faithful_size']}"
        )
    comp = s.get("component_circuit") or {}
    if comp.get("size") is None:
        components = "no component circuit is faithful"
    else:
        components = (
            f"component circuit n={comp['size']} faithfulness "
            f"{_fmt(comp['faithfulness'])} (held out {_fmt(comp['faithfulness_heldout'])})"
        )
    n_flags = len(s.get("flags") or [])
    flagged = f"; {n_flags} flags in summary.json" if n_flags else ""
    return f"{behaviour}: {components}; {circuit}; top head drops {heads or 'none'}{flagged}"
