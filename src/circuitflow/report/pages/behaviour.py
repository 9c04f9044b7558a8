"""A behaviour's page (report/{behaviour}/tables.html), what generalises first: per behaviour,
its per-prompt graphs (with transcoders), the component circuit beside the feature circuit with
held out beside selection, the flags on its headline numbers (a random control that reaches
its circuit's value, a faithfulness under the threshold), the faithfulness and completeness
summary with its random controls, attribution's validation kind by kind, the top attribution
nodes, single-head ablations and head sets (inert heads, score exactly 0, left out and named).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow.features.read import read_labels, read_neuronpedia_ids
from circuitflow.interventions import flags as fl
from circuitflow.interventions.inputs import ATTRIBUTION_TABLES
from circuitflow.nodes import neuronpedia_url
from circuitflow.report import inputs
from circuitflow.report.html import cell, note, table_html

# The interventions summary's keys the page shows (interventions/summary.py writes them all;
# `flags` is left out: interventions/flags.py computes them for a summary without).
SUMMARY_KEYS = (
    "ablation", "n_prompts_selection", "n_prompts_heldout", "logit_diff_clean",
    "logit_diff_empty", "circuit_size", "circuit_size_source", "circuit", "faithfulness",
    "faithfulness_std", "random_faithfulness", "faithfulness_heldout",
    "faithfulness_heldout_std", "random_faithfulness_heldout", "completeness",
    "completeness_std", "random_completeness", "completeness_heldout",
    "completeness_heldout_std", "random_completeness_heldout", "faithfulness_auc", "n_nodes",
    "circuit_nodes", "faithfulness_threshold", "smallest_faithful_size",
    "smallest_faithful_by_kind", "random_faithfulness_at_smallest", "graph_circuit",
    "component_circuit", "top_k_heads", "inert_heads", "seeds",
)  # fmt: skip
# What the page shows of each per-prompt graph (attribution/{behaviour}/prompt_graphs/).
PROMPT_GRAPH_KEYS = ("slug", "top_token_position", "top_token", "kept_features", "kept_nodes",
                     "replacement_score", "completeness_score")  # fmt: skip
# The interventions tables the page shows, and the columns it cannot do without.
HEAD_SETS_COLUMNS = ("set", "heads", "score")
SINGLE_HEADS_COLUMNS = ("layer", "head", "score")


def read_summary(iv_dir: Path | str) -> dict[str, Any]:
    """interventions/{behaviour}/summary.json, holding every key the page shows."""
    return inputs.json_of(
        Path(iv_dir) / "summary.json", SUMMARY_KEYS, "interventions", "interventions summary"
    )


def _top(frame: pd.DataFrame, n: int, by: str = "score") -> pd.DataFrame:
    if frame.empty or by not in frame:
        return frame
    return frame.reindex(frame[by].abs().sort_values(ascending=False).index).head(n)


def _cols(frame: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return frame[[c for c in cols if c in frame.columns]]


def _first(items: list, n: int) -> str:
    more = f", ... ({len(items) - n} more)" if len(items) > n else ""
    return ", ".join(map(str, items[:n])) + more


def _num(x: Any, spec: str = ".3f") -> str:
    """A summary number, or `n/a` where summary.json has none (null: not a number)."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or pd.isna(x):
        return "n/a"
    return format(x, spec)


def _graph_cell(graph: dict | None) -> str:
    if not graph:
        return "no graph (none of its nodes is a circuit candidate)"
    return (
        f"{_num(graph.get('faithfulness'))} (held out {_num(graph.get('faithfulness_heldout'))}), "
        f"{_num(graph.get('completeness'))} (held out {_num(graph.get('completeness_heldout'))}) "
        f"({graph.get('n')} nodes)"
    )


NO_CIRCUIT = "none: no circuit size is faithful on the selection half"


def _mean_std(summary: dict, key: str) -> str:
    """`mean ± std` of a summary metric, or why there is none (undefined: the metric does not
    depend on the nodes; no faithful circuit size)."""
    value = summary.get(key)
    why = (summary.get("undefined") or {}).get(key)
    if value is None and why:
        return f"undefined: {why}"
    if value is None:
        return NO_CIRCUIT if summary.get("circuit_size") is None else "n/a"
    return f"{_num(value)} ± {_num(summary.get(key + '_std') or 0)}"


def _flag_cells(summary: dict, rows: list[tuple[str, Any, tuple[str, ...]]]) -> list[str]:
    """Per row, the flags (interventions/flags.py) on the numbers it shows: the row's keys are
    flag keys (`faithfulness_heldout`, ...) or, for a control's row, its `random_*` key."""
    marks: dict[str, list[str]] = {}
    reaches = fl.random_reaches_circuit(summary)
    for key, control in fl.RANDOM_CONTROLS:
        if reaches[key]:
            for k in (key, control):
                marks.setdefault(k, []).append("random control reaches the circuit's value")
    for key, under in fl.below_threshold(summary).items():
        if under:
            marks.setdefault(key, []).append("under the faithfulness threshold")
    return [
        "; ".join(dict.fromkeys(m for k in keys for m in marks.get(k, []))) for *_, keys in rows
    ]


def flags_html(summary: dict) -> str:
    """The summary's flags as a list, or a line saying there are none."""
    found = fl.flags(summary)
    if not found:
        return note(
            "no flags: every random control stays under its circuit's value and every "
            "faithfulness reaches the threshold"
        )
    items = "".join(f'<li class="bad">{html.escape(f["text"])}</li>' for f in found)
    return f"<ul>{items}</ul>"


def validation_html(graph: dict) -> str:
    """Attribution's validation against exact patching: the verdict (every kind with enough
    nodes must pass) and the agreement kind by kind."""
    val = graph.get("validation") or {}
    verdict = {True: "passed", False: "failed"}.get(val.get("passed"), "not judged")
    failed = val.get("failed_kinds") or []
    text = (
        f"{html.escape(str(val.get('method')))} against exact patching: Spearman "
        f"{_num(val.get('spearman'))} over {val.get('n_nodes')} nodes (threshold "
        f'{val.get("threshold")}): <span class="{"ok" if val.get("passed") else "bad"}">'
        f"{verdict}</span>"
    )
    if val.get("spearman_undefined"):
        text += f"; Spearman undefined: {html.escape(val['spearman_undefined'])}"
    if failed:
        text += (
            f"; kinds with at least {val.get('min_kind_nodes')} nodes that fail: "
            + html.escape(", ".join(failed))
        )
    rows = [
        {"kind": k, "spearman": v.get("spearman"), "n_nodes": v.get("n_nodes"),
         "n_inert": v.get("n_inert"), "passed": v.get("passed")}
        for k, v in sorted((val.get("by_kind") or {}).items())
    ]  # fmt: skip
    return note(text) + (table_html(pd.DataFrame(rows)) if rows else "")


def prompt_graphs_table(graphs_dir: Path | str) -> pd.DataFrame:
    """One row per per-prompt graph (attribution/{behaviour}/prompt_graphs/summary.json): the
    prompt, the input token with the most influence on the metric, what pruning kept, the
    graph's scores and its check on the model (the rank agreement of predicted and measured
    feature ablations, live and with the norms frozen, and the pruned graph's faithfulness)."""
    graphs_dir = Path(graphs_dir)
    summary_path = graphs_dir / "summary.json"
    summary = inputs.json_of(summary_path, ("graphs",), "prompt_graphs", "prompt graphs summary")
    rows = []
    for g in summary["graphs"]:
        inputs.entry_of(summary_path, g, PROMPT_GRAPH_KEYS, "a graph's entry")
        meta = inputs.json_of(
            graphs_dir / f"{g['slug']}.json", ("metadata",), "prompt_graphs", "prompt graph"
        )["metadata"]
        tokens = meta.get("prompt_tokens") or []
        at = g["top_token_position"]
        top = tokens[at] if at < len(tokens) else g["top_token"]
        check = g.get("validation") or {}
        rows.append(
            {
                "prompt": meta.get("prompt", ""),
                "top input token (position)": f"{top!r} ({at})",
                "kept features / nodes": f"{g['kept_features']} / {g['kept_nodes']}",
                "replacement score": _num(g["replacement_score"]),
                "completeness score": _num(g["completeness_score"]),
                "ablations: spearman (norms frozen)": f"{_num(check.get('spearman'))} "
                f"({_num(check.get('spearman_frozen_norms'))})",
                "pruned graph's faithfulness": _num(check.get("faithfulness")),
                "agreement": {True: "ok", False: "poor", None: "n/a"}[check.get("passed")],
            }
        )
    return pd.DataFrame(rows)


def circuits_headline(summary: dict) -> pd.DataFrame:
    """The behaviour page's lead: what generalises first. One row per circuit, the component
    circuit (shared by every prompt), then the circuit of the configured candidates (with
    residual features, token-specific, it can overfit its selection prompts) and the
    attribution graph's nodes, each with its faithfulness and completeness on the selection
    half and held out side by side, and the held-out random control."""
    comp = summary.get("component_circuit") or {}
    graph = summary.get("graph_circuit") or {}
    kinds = summary.get("circuit_nodes") or ""
    rows = [
        ("component circuit (embedding, heads, MLPs), smallest faithful", comp.get("size"),
         comp, comp.get("random_faithfulness_heldout")),
        (f"circuit of {kinds}, {summary.get('circuit_size_source')}", summary.get("circuit_size"),
         summary, summary.get("random_faithfulness_heldout")),
        ("attribution graph's nodes as a circuit", graph.get("n"), graph, None),
    ]  # fmt: skip
    return pd.DataFrame(
        [
            {
                "circuit": name,
                "nodes": "none faithful" if size is None else size,
                "faithfulness (selection)": _num(values.get("faithfulness")),
                "faithfulness (held out)": _num(values.get("faithfulness_heldout")),
                "random control (held out)": _num(control),
                "completeness (selection)": _num(values.get("completeness")),
                "completeness (held out)": _num(values.get("completeness_heldout")),
            }
            for name, size, values, control in rows
        ]
    )


def circuit_views_table(summary: dict) -> pd.DataFrame | None:
    """The two views of the circuit (summary.json's `ablation_circuit`, `patching_circuit`):
    what the behaviour needs and what carries the difference, each its pruned minimal faithful
    circuit with its nodes, faithfulness on both halves, MIB's CPR (higher is better) and CMD
    (lower is better) of its top-n curve held out, and what pruning cost; None for a summary
    written before them."""
    views = [
        (name, summary.get(key))
        for name, key in (
            ("what the behaviour needs", "ablation_circuit"),
            ("what carries the difference", "patching_circuit"),
            ("what the behaviour needs, components", "component_ablation_circuit"),
            ("what carries the difference, components", "component_patching_circuit"),
        )
        if summary.get(key)
    ]
    if not views:
        return None
    rows = []
    for name, v in views:
        pruning = v.get("pruning") or {}
        rows.append(
            {
                "view": name,
                "judged by": v.get("judged_by"),
                "nodes": "none faithful" if v.get("size") is None else v["size"],
                "circuit": _first(v.get("nodes") or [], 12),
                "faithfulness (selection)": _num(v.get("faithfulness")),
                "faithfulness (held out)": _num(v.get("faithfulness_heldout")),
                "completeness (held out)": _num(v.get("completeness_heldout")),
                "CPR (held out)": _num(v.get("cpr")),
                "CMD (held out)": _num(v.get("cmd")),
                "pruned from": v.get("smallest_prefix"),
                "pruning runs (bound)": "n/a"
                if not pruning
                else "skipped: above prune_max_nodes"
                if pruning.get("skipped")
                else f"{pruning.get('runs')} ({pruning.get('bound_runs')})",
            }
        )
    return pd.DataFrame(rows)


def _leave_out_inert(frame: pd.DataFrame, what: str) -> tuple[pd.DataFrame, str]:
    """Heads whose score is exactly 0 (a pruned head, W_O = 0, or one nothing moves: for
    attribution's score, a head that carries no difference; for the ablation effect, an inert
    one) left out of a heads table, and a note naming them."""
    if frame.empty or "score" not in frame:
        return frame, ""
    inert = frame[frame["score"] == 0]
    if inert.empty:
        return frame, ""
    names = ", ".join(f"L{int(r.layer)}H{int(r.head)}" for r in inert.itertuples())
    return frame[frame["score"] != 0], note(
        f"{len(inert)} heads whose {what} is exactly 0 (such as pruned heads) are not "
        f"shown: {names}"
    )


def _summary_table(summary: dict) -> pd.DataFrame:
    """The faithfulness and completeness summary: one row per quantity, with the flags on the
    numbers it shows."""
    size = summary.get("circuit_size")
    smallest = summary.get("smallest_faithful_size")
    threshold = summary.get("faithfulness_threshold")
    halves = (f"{summary.get('n_prompts_selection')} prompts to choose the circuit on, "
              f"{summary.get('n_prompts_heldout')} held out")  # fmt: skip
    rows = [
        ("ablation", summary.get("ablation"), ()),
        ("prompts", halves, ()),
        ("logit difference, clean model", summary.get("logit_diff_clean"), ()),
        ("logit difference, everything ablated", summary.get("logit_diff_empty"), ()),
        ("circuit size (source)", f"{'none' if size is None else size} "
         f"({summary.get('circuit_size_source')})", ()),
        ("circuit (top nodes)", _first(summary.get("circuit") or [], 24) or "none", ()),
        ("faithfulness ± std, selection half", _mean_std(summary, "faithfulness"),
         ("faithfulness",)),
        ("faithfulness, random circuits of that make-up (control, selection half)",
         summary.get("random_faithfulness"), ("random_faithfulness",)),
        ("faithfulness ± std, held-out half", _mean_std(summary, "faithfulness_heldout"),
         ("faithfulness_heldout",)),
        ("faithfulness, random circuits of that make-up (control, held out)",
         summary.get("random_faithfulness_heldout"), ("random_faithfulness_heldout",)),
        ("completeness ± std, selection half", _mean_std(summary, "completeness"),
         ("completeness",)),
        ("completeness, random circuits (control, selection half)",
         summary.get("random_completeness"), ("random_completeness",)),
        ("completeness ± std, held-out half", _mean_std(summary, "completeness_heldout"),
         ("completeness_heldout",)),
        ("completeness, random circuits (control, held out)",
         summary.get("random_completeness_heldout"), ("random_completeness_heldout",)),
        ("mean faithfulness over log circuit size (AUC), held out",
         summary.get("faithfulness_auc"), ()),
        ("circuit candidates", f"{summary.get('n_nodes')} nodes: {summary.get('circuit_nodes')}",
         ()),
        (f"smallest circuit with faithfulness >= {threshold}",
         f"{smallest} nodes {cell(summary.get('smallest_faithful_by_kind'))}"
         if smallest is not None else NO_CIRCUIT, ("faithfulness_at_smallest",)),
        ("faithfulness of random circuits of that size (control)",
         summary.get("random_faithfulness_at_smallest"), ("random_faithfulness_at_smallest",)),
        ("attribution graph's nodes as a circuit: faithfulness, completeness",
         _graph_cell(summary.get("graph_circuit")),
         ("graph_circuit.faithfulness", "graph_circuit.faithfulness_heldout")),
        ("seeds", summary.get("seeds"), ()),
    ]  # fmt: skip
    return pd.DataFrame(
        {
            "quantity": [q for q, *_ in rows],
            "value": [cell(v) for _, v, _ in rows],
            "flag": _flag_cells(summary, rows),
        }
    )


def _head_sets_note(summary: dict) -> str:
    """The heads whose pairs and triplets were ablated, and the inert heads left out."""
    among = summary.get("top_k_heads")
    if among is None:
        return ""
    left_out = summary.get("left_out_heads") or []
    return note(
        f"among the top heads by attribution: {', '.join(among)}"
        + (
            f" (heads inert and carrying no difference left out: {', '.join(left_out)})"
            if left_out
            else ""
        )
    )


def behaviour_sections(
    attr_dir: Path | str, iv_dir: Path | str, n: int = 15, prompt_graphs: Path | str | None = None,
    feature_dirs=(),
) -> list:  # fmt: skip
    """Sections of a behaviour's page, what generalises first: its per-prompt graphs (with
    transcoders: `prompt_graphs`, their directory), the component circuit beside the feature
    circuit, held out beside selection; then the flags on its headline numbers, the
    interventions' summary with controls, attribution's validation and top nodes (each SAE
    feature with its label from the features stage's `feature_dirs`), head ablations (single
    and sets)."""
    attr_dir, iv_dir = Path(attr_dir), Path(iv_dir)
    sections = []
    if prompt_graphs is not None:
        sections.append(
            ("Per-prompt graphs on the transcoders (attribution/prompt_graphs/summary.json)",
             note("one exact attribution graph per prompt (prompt_graphs.html draws them): the "
                  "input token the answer depends on most, and the graph checked on the model")
             + table_html(prompt_graphs_table(prompt_graphs)))
        )  # fmt: skip
    summary = read_summary(iv_dir)
    lead = note(
        "components are shared by every prompt; residual SAE features are token-specific, so a "
        "circuit of them can fit its selection prompts and not the held-out ones: read the "
        "held-out column first"
    )
    sections.append(("Circuits, held out beside selection (interventions/summary.json)",
                     lead + table_html(circuits_headline(summary))))  # fmt: skip
    views = circuit_views_table(summary)
    if views is not None:
        sections.append(
            ("Two views of the circuit, pruned (interventions/summary.json)",
             note("what the behaviour needs: ranked by each node's score against the run's "
                  "ablation and judged by it; what carries the difference: ranked by attribution "
                  "and judged by patching from the corrupted prompt. CPR: area under the "
                  "faithfulness curve (higher is better); CMD: area between it and 1 (lower is "
                  "better)")
             + table_html(views))
        )  # fmt: skip
    sections.append(("Flags on these numbers (interventions/summary.json)", flags_html(summary)))
    sections.append(("Faithfulness and completeness (interventions/summary.json)",
                     table_html(_summary_table(summary))))  # fmt: skip
    graph = inputs.optional_json_of(
        attr_dir / "graph.json", ("nodes",), "attribution", "attribution graph"
    )
    if graph is not None:
        sections.append(
            ("Attribution's validation against exact patching (attribution/graph.json)",
             validation_html(graph))
        )  # fmt: skip
    sections += _attribution_sections(attr_dir, n, read_labels(feature_dirs),
                                      read_neuronpedia_ids(feature_dirs))  # fmt: skip
    sections += _ablation_sections(iv_dir, summary, n)
    return sections


def _attribution_table(attr_dir: Path, name: str) -> pd.DataFrame:
    return inputs.table_of(
        attr_dir / f"{name}.parquet", ATTRIBUTION_TABLES[name], "attribution",
        f"attribution {name} table",
    )  # fmt: skip


def with_labels(features: pd.DataFrame, labels: dict[tuple[str, int], dict[int, str]]):
    """`features` with each feature's `label` (features.read.read_labels' `labels`): `error
    term` for feature -1, empty where the features stage has no label."""

    def label(r) -> str:
        if int(r.feature) < 0:
            return "error term"
        return labels.get((r.site, int(r.layer)), {}).get(int(r.feature), "")

    return features.assign(label=[label(r) for r in features.itertuples()])


def _attribution_sections(
    attr_dir: Path,
    n: int,
    labels: dict[tuple[str, int], dict[int, str]],
    neuronpedia: dict[tuple[str, int], str] | None = None,
) -> list[tuple[str, str]]:
    """The top heads and SAE features by attribution (each with its label, and its Neuronpedia
    page where its SAE names an id), inert heads named and left out."""
    heads, left_out = _leave_out_inert(_attribution_table(attr_dir, "heads"), "score")
    features = with_labels(_top(_attribution_table(attr_dir, "features"), n), labels)
    feat_cols = ["site", "layer", "feature", "label", "kind", "score", "rank"]
    if neuronpedia:  # published SAEs that name their Neuronpedia ids: each feature's page
        features = features.assign(neuronpedia=[
            neuronpedia_url(neuronpedia.get((r.site, int(r.layer))), r.feature)
            if int(r.feature) >= 0 else None for r in features.itertuples()
        ])  # fmt: skip
        feat_cols.append("neuronpedia")
    return [
        (
            f"Top {n} heads by attribution (attribution/heads.parquet)",
            left_out
            + table_html(_cols(_top(heads, n), ["layer", "head", "score", "score_exact", "rank"])),
        ),
        (
            f"Top {n} SAE features by attribution (attribution/features.parquet)",
            note(
                "feature -1 is the SAE's error term; label: the features stage's, made from the "
                "tokens the feature fires on and promotes (report/features.html has its card)"
            )
            + table_html(_cols(features, feat_cols), links=("neuronpedia",)),
        ),
    ]


def _ablation_sections(iv_dir: Path, summary: dict, n: int) -> list[tuple[str, str]]:
    """Single-head ablations (inert heads named and left out) and the head sets."""
    singles = inputs.table_of(
        iv_dir / "heads.parquet", SINGLE_HEADS_COLUMNS, "interventions", "single-head table"
    )
    singles, left_out = _leave_out_inert(singles, "ablation effect")
    head_cols = [
        "layer", "head", "score", "score_std", "drop_frac", "accuracy_change",
        "calibration_error_change", "p_value", "attribution_score", "rank",
    ]  # fmt: skip
    sets = inputs.table_of(
        iv_dir / "head_sets.parquet", HEAD_SETS_COLUMNS, "interventions", "head sets table"
    )
    set_cols = ["set", "heads", "score", "score_std", "additive", "interaction", "drop_frac"]
    top_sets = sets[sets["set"] != "random"]
    return [
        (
            f"Single-head ablations, top {n} by effect (interventions/heads.parquet)",
            left_out + table_html(_cols(_top(singles, n), head_cols)),
        ),
        (
            f"Head pairs and triplets, top {n} (interventions/head_sets.parquet)",
            _head_sets_note(summary) + table_html(_cols(_top(top_sets, n), set_cols)),
        ),
    ]
