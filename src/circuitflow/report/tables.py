"""Tables and summary figures for `snakemake --report`: self-contained HTML pages (the report
shows HTML and images inline) with a CSV beside each table for reuse.

- `sae_table` / `plot_sae_metrics` / `plot_controller`: SAE metrics per site and layer (L0,
  explained variance, CE loss recovered, dead fraction) and the L0 controller's history.
- `baseline_table`: baseline metrics of every behaviour.
- `behaviour_sections`: per behaviour, the flags on its headline numbers (a random control that
  reaches its circuit's value, a faithfulness under the threshold), the faithfulness and
  completeness summary with its random controls, attribution's validation kind by kind, the top
  attribution nodes, single-head ablations and head sets (inert heads, score exactly 0, left
  out and named).
- `provenance_page`: the reproducibility checklist from `provenance/`.
- `gpu_hours_sections`: GPU-hours of a full run from the GPU suite's results, and those results.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd

STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; font-size: 14px;
       margin: 1em 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f3f7; } td.text, th.text { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
.note { color: #555; max-width: 60em; } .ok { color: #1a7f37; } .bad { color: #cf222e; }
pre { background: #f6f8fa; padding: 0.6em; max-height: 30em; overflow: auto; font-size: 12px; }
"""


def _cell(value: Any) -> str:
    if value is None or (not isinstance(value, (list, tuple, dict)) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def table_html(frame: pd.DataFrame, max_rows: int | None = None) -> str:
    """A plain HTML table (numbers right-aligned, 4 significant digits)."""
    if max_rows is not None:
        frame = frame.head(max_rows)
    numeric = {c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}
    head = "".join(
        f'<th class="{"" if c in numeric else "text"}">{html.escape(str(c))}</th>'
        for c in frame.columns
    )
    rows = []
    for row in frame.itertuples(index=False):
        cells = "".join(
            f'<td class="{"" if c in numeric else "text"}">{html.escape(_cell(v))}</td>'
            for c, v in zip(frame.columns, row, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def page(title: str, sections: list[tuple[str, str]], intro: str = "") -> str:
    """A self-contained HTML page: `sections` are (heading, HTML body) pairs."""
    body = "".join(f"<h2>{html.escape(h)}</h2>\n{b}\n" for h, b in sections)
    intro_html = f'<p class="note">{intro}</p>' if intro else ""
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{intro_html}\n"
        f"{body}</body></html>\n"
    )


def note(text: str) -> str:
    return f'<p class="note">{text}</p>'


# ---- SAEs ----------------------------------------------------------------------------------

SAE_COLUMNS = [
    "site",
    "layer",
    "kind",  # sae, or transcoder: its explained variance and CE are of the MLP it replaces
    "architecture",
    "d_in",
    "d_sae",
    "l0",
    "explained_variance",
    "ce_loss_recovered",
    "dead_fraction",
    "ce_clean",
    "ce_sae",
    "ce_zero",
    "tokens_trained",
    "wall_time_s",
    "peak_memory_mb",
    "device",
    "resumed",
]


def read_sae_metrics(sae_dirs: list[Path | str]) -> list[dict]:
    return [json.loads((Path(d) / "metrics.json").read_text()) for d in sae_dirs]


def sae_table(metrics: list[dict]) -> pd.DataFrame:
    rows = [{c: m.get(c) for c in SAE_COLUMNS} | {"kind": m.get("kind", "sae")} for m in metrics]
    frame = pd.DataFrame(rows, columns=SAE_COLUMNS)
    return frame.sort_values(["site", "layer"]).reset_index(drop=True)


def plot_sae_metrics(frame: pd.DataFrame):
    """One panel per metric, one line per site, layers on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("l0", "L0 (active latents per token)"),
        ("explained_variance", "explained variance"),
        ("ce_loss_recovered", "CE loss recovered"),
        ("dead_fraction", "dead fraction"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (col, label) in zip(axes[0], panels, strict=True):
        for site, group in frame.groupby("site"):
            ax.plot(group["layer"], group[col].astype(float), "o-", label=site)
        ax.set_title(label)
        ax.set_xlabel("layer")
        ax.set_xticks(sorted(frame["layer"].unique()))
        if col in ("explained_variance", "ce_loss_recovered", "dead_fraction"):
            ax.set_ylim(min(0.0, ax.get_ylim()[0]), max(1.05, ax.get_ylim()[1]))
        ax.grid(alpha=0.3)
    axes[0][0].legend(title="site", fontsize=8)
    fig.suptitle("SAE metrics per layer")
    fig.tight_layout()
    return fig


def plot_controller(metrics: list[dict]):
    """L0 and the sparsity coefficient over training for SAEs with a controller (standard,
    jumprelu); a note for TopK SAEs, whose L0 is fixed by k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l0, ax_coef) = plt.subplots(1, 2, figsize=(10, 3.4))
    drawn = 0
    for m in sorted(metrics, key=lambda m: (m.get("site", ""), m.get("layer", 0))):
        history = m.get("controller_history") or []
        if not history:
            continue
        label = f"{m.get('site')} L{m.get('layer')}"
        steps = [h["step"] for h in history]
        ax_l0.plot(steps, [h["l0"] for h in history], label=label)
        ax_coef.plot(steps, [h["coefficient"] for h in history], label=label)
        drawn += 1
    target = next((m["config"].get("target_l0") for m in metrics if m.get("config")), None)
    if drawn and target:
        ax_l0.axhline(target, color="grey", ls="--", label="target L0")
    if not drawn:
        archs = sorted({str(m.get("architecture")) for m in metrics})
        for ax in (ax_l0, ax_coef):
            ax.text(
                0.5,
                0.5,
                f"no L0 controller: architecture {', '.join(archs)}\n(L0 is fixed by k)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
    else:
        ax_l0.legend(fontsize=8)
    ax_l0.set(title="L0 during training", xlabel="step", ylabel="L0")
    ax_coef.set(title="sparsity coefficient", xlabel="step", ylabel="coefficient")
    fig.tight_layout()
    return fig


# ---- Baseline and per-behaviour results ----------------------------------------------------

BASELINE_COLUMNS = [
    "behaviour",
    "n_prompts",
    "logit_diff_mean",
    "logit_diff_std",
    "corrupted_logit_diff_mean",
    "accuracy",
    "top1_accuracy",
    "expected_calibration_error",
    "brier_score",
]


def baseline_table(paths: list[Path | str]) -> pd.DataFrame:
    rows = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        rows.append({"behaviour": data.get("behaviour", Path(path).stem)} | data)
    return pd.DataFrame(rows).reindex(columns=BASELINE_COLUMNS)


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
    """`mean ± std` of a summary metric, or why there is none (no faithful circuit size)."""
    value = summary.get(key)
    if value is None:
        return NO_CIRCUIT if summary.get("circuit_size") is None else "n/a"
    return f"{_num(value)} ± {_num(summary.get(key + '_std') or 0)}"


def _flag_cells(summary: dict, rows: list[tuple[str, Any, tuple[str, ...]]]) -> list[str]:
    """Per row, the flags (interventions/flags.py) on the numbers it shows: the row's keys are
    flag keys (`faithfulness_heldout`, ...) or, for a control's row, its `random_*` key."""
    from circuitflow.interventions import flags as fl

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
    from circuitflow.interventions.flags import flags

    found = flags(summary)
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
    summary = json.loads((graphs_dir / "summary.json").read_text())
    rows = []
    for g in summary["graphs"]:
        meta = json.loads((graphs_dir / f"{g['slug']}.json").read_text())["metadata"]
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


def _leave_out_inert(frame: pd.DataFrame, what: str) -> tuple[pd.DataFrame, str]:
    """Heads whose score is exactly 0 (inert: a pruned head, W_O = 0, or one nothing moves)
    left out of a heads table, and a note naming them."""
    if frame.empty or "score" not in frame:
        return frame, ""
    inert = frame[frame["score"] == 0]
    if inert.empty:
        return frame, ""
    names = ", ".join(f"L{int(r.layer)}H{int(r.head)}" for r in inert.itertuples())
    return frame[frame["score"] != 0], note(
        f"{len(inert)} heads whose {what} is exactly 0 (inert, such as pruned heads) are not "
        f"shown: {names}"
    )


def behaviour_sections(
    attr_dir: Path | str, iv_dir: Path | str, n: int = 15, prompt_graphs: Path | str | None = None
) -> list:
    """Sections of a behaviour's page, what generalises first: its per-prompt graphs (with
    transcoders: `prompt_graphs`, their directory), the component circuit beside the feature
    circuit, held out beside selection; then the flags on its headline numbers, the
    interventions' summary with controls, attribution's validation and top nodes, head
    ablations (single and sets)."""
    attr_dir, iv_dir = Path(attr_dir), Path(iv_dir)
    sections = []
    if prompt_graphs is not None:
        sections.append(
            ("Per-prompt graphs on the transcoders (attribution/prompt_graphs/summary.json)",
             note("one exact attribution graph per prompt (prompt_graphs.html draws them): the "
                  "input token the answer depends on most, and the graph checked on the model")
             + table_html(prompt_graphs_table(prompt_graphs)))
        )  # fmt: skip
    summary = json.loads((iv_dir / "summary.json").read_text())
    halves = (f"{summary.get('n_prompts_selection')} prompts to choose the circuit on, "
              f"{summary.get('n_prompts_heldout')} held out")  # fmt: skip
    size = summary.get("circuit_size")
    smallest = summary.get("smallest_faithful_size")
    threshold = summary.get("faithfulness_threshold")
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
         f"{smallest} nodes {_cell(summary.get('smallest_faithful_by_kind'))}"
         if smallest is not None else NO_CIRCUIT, ("faithfulness_at_smallest",)),
        ("faithfulness of random circuits of that size (control)",
         summary.get("random_faithfulness_at_smallest"), ("random_faithfulness_at_smallest",)),
        ("attribution graph's nodes as a circuit: faithfulness, completeness",
         _graph_cell(summary.get("graph_circuit")),
         ("graph_circuit.faithfulness", "graph_circuit.faithfulness_heldout")),
        ("seeds", summary.get("seeds"), ()),
    ]  # fmt: skip
    table = pd.DataFrame(
        {
            "quantity": [q for q, *_ in rows],
            "value": [_cell(v) for _, v, _ in rows],
            "flag": _flag_cells(summary, rows),
        }
    )
    lead = note(
        "components are shared by every prompt; residual SAE features are token-specific, so a "
        "circuit of them can fit its selection prompts and not the held-out ones: read the "
        "held-out column first"
    )
    sections.append(("Circuits, held out beside selection (interventions/summary.json)",
                     lead + table_html(circuits_headline(summary))))  # fmt: skip
    sections.append(("Flags on these numbers (interventions/summary.json)", flags_html(summary)))
    sections.append(("Faithfulness and completeness (interventions/summary.json)",
                     table_html(table)))  # fmt: skip
    graph_path = attr_dir / "graph.json"
    if graph_path.exists():
        graph = json.loads(graph_path.read_text())
        sections.append(
            ("Attribution's validation against exact patching (attribution/graph.json)",
             validation_html(graph))
        )  # fmt: skip
    heads, left_out = _leave_out_inert(pd.read_parquet(attr_dir / "heads.parquet"), "score")
    sections.append(
        (
            f"Top {n} heads by attribution (attribution/heads.parquet)",
            left_out
            + table_html(_cols(_top(heads, n), ["layer", "head", "score", "score_exact", "rank"])),
        )
    )
    features = pd.read_parquet(attr_dir / "features.parquet")
    feat_cols = ["site", "layer", "feature", "kind", "score", "rank"]
    sections.append(
        (
            f"Top {n} SAE features by attribution (attribution/features.parquet)",
            note("feature -1 is the SAE's error term")
            + table_html(_cols(_top(features, n), feat_cols)),
        )
    )
    singles, left_out = _leave_out_inert(
        pd.read_parquet(iv_dir / "heads.parquet"), "ablation effect"
    )
    head_cols = [
        "layer", "head", "score", "score_std", "drop_frac", "accuracy_change",
        "calibration_error_change", "p_value", "attribution_score", "rank",
    ]  # fmt: skip
    sections.append(
        (
            f"Single-head ablations, top {n} by effect (interventions/heads.parquet)",
            left_out + table_html(_cols(_top(singles, n), head_cols)),
        )
    )
    sets = pd.read_parquet(iv_dir / "head_sets.parquet")
    set_cols = ["set", "heads", "score", "score_std", "additive", "interaction", "drop_frac"]
    top_sets = sets[sets["set"] != "random"] if "set" in sets else sets
    among = summary.get("top_k_heads")
    inert = summary.get("inert_heads") or []
    set_note = (
        note(
            f"among the top heads by attribution: {', '.join(among)}"
            + (f" (inert heads left out: {', '.join(inert)})" if inert else "")
        )
        if among is not None
        else ""
    )
    sections.append(
        (
            f"Head pairs and triplets, top {n} (interventions/head_sets.parquet)",
            set_note + table_html(_cols(_top(top_sets, n), set_cols)),
        )
    )
    return sections


# ---- Provenance ------------------------------------------------------------------------------


def _kv_table(items: list[tuple[str, Any]]) -> str:
    frame = pd.DataFrame([(k, _cell(v)) for k, v in items], columns=["item", "value"])
    return table_html(frame)


def provenance_sections(prov_dir: Path | str) -> list[tuple[str, str]]:
    """The reproducibility checklist from provenance/*.json|yaml|txt."""
    prov = Path(prov_dir)
    env = json.loads((prov / "environment.json").read_text())
    run = json.loads((prov / "run.json").read_text()) if (prov / "run.json").exists() else {}
    hashes = json.loads((prov / "hashes.json").read_text())
    slurm = json.loads((prov / "slurm_jobs.json").read_text())
    git = env.get("pipeline_git") or {}
    gpus = env.get("gpus") or []
    check = [
        ("pipeline git commit", git.get("commit")),
        ("uncommitted changes (dirty)", git.get("dirty")),
        ("seeds", json.dumps(run.get("seeds", {}))),
        ("python", env.get("python")),
        ("torch", env.get("torch")),
        ("CUDA / cuDNN", f"{env.get('cuda_version')} / {env.get('cudnn_version')}"),
        ("GPU driver", env.get("driver")),
        ("GPUs", f"{len(gpus)} x {gpus[0]['name']} ({gpus[0]['memory_gib']} GiB)" if gpus
         else "none (CPU)"),
        ("hostname / platform", f"{env.get('hostname')} / {env.get('platform')}"),
        ("loaded modules", env.get("modules") or "none"),
        ("Slurm job variables (provenance job)", json.dumps(env.get("slurm") or {})),
        ("collected at", env.get("collected_at")),
    ]  # fmt: skip
    sections = [("Reproducibility checklist", _kv_table(check))]
    packages = env.get("packages") or {}
    sections.append(("Key package versions", _kv_table(sorted(packages.items()))))
    hash_rows = [
        {"kind": kind, "path": path, "sha256": digest}
        for kind, entries in hashes.get("files", {}).items()
        for path, digest in entries.items()
    ]
    extra = "".join(
        f"<li>{html.escape(k)}: <code>{html.escape(str(v))}</code></li>"
        for k, v in hashes.get("content_hashes", {}).items()
    )
    sections.append(
        (
            "Hashes of inputs (provenance/hashes.json)",
            (f"<ul>{extra}</ul>" if extra else "") + table_html(pd.DataFrame(hash_rows)),
        )
    )
    jobs = pd.DataFrame(slurm.get("jobs") or [])
    body = note(html.escape(slurm.get("reason") or ""))
    if not jobs.empty:
        body += table_html(jobs)
    sections.append(("Slurm jobs (provenance/slurm_jobs.json)", body))
    failed = run.get("failed_jobs") or []
    fail_body = (
        table_html(pd.DataFrame(failed))
        if failed
        else note("no failed jobs recorded (Snakemake logs in .snakemake/log" +
                  (" and sacct" if slurm.get("jobs") else "") + ")")
    )  # fmt: skip
    sections.append(("Failed jobs and reasons", fail_body))
    config_file = prov / "config.resolved.yaml"
    if config_file.exists():
        sections.append(("Resolved config", f"<pre>{html.escape(config_file.read_text())}</pre>"))
    freeze = prov / "pip_freeze.txt"
    if freeze.exists():
        sections.append(("pip freeze", f"<pre>{html.escape(freeze.read_text())}</pre>"))
    return sections


# ---- GPU-hours -------------------------------------------------------------------------------

SUITE_COLUMNS = [
    "model", "stage", "variant", "tokens_per_s", "prompts_per_s", "batch_size", "dtype",
    "peak_memory_mb", "planned_memory_mb", "plan_ratio", "flops_per_token", "achieved_tflops",
    "roofline_share", "ratio_to_forward",
]  # fmt: skip


def suite_table(suite: dict) -> pd.DataFrame:
    """The GPU suite's records: rate, peak memory against the plan, roofline share."""
    frame = pd.DataFrame(suite["results"])
    for col in ("peak_memory_bytes", "planned_memory_bytes"):
        if col in frame:
            frame[col.replace("_bytes", "_mb")] = frame[col] / 2**20
    frame["achieved_tflops"] = frame["achieved_flops"] / 1e12
    return frame.reindex(columns=SUITE_COLUMNS)


def gpu_hours_sections(
    suite_paths: list[Path | str],
    run_config: dict,
    reference: dict,
    reference_name: str,
    gpu: str = "A100",
    cluster=None,
) -> list[tuple[str, str]]:
    """Per suite result file: hours on a `gpu` of this run (when the suite covers its model) and of
    the reference run (`reference`, the CSD3 Qwen2.5-0.5B config), then the suite's figures."""
    from circuitflow.report import gpu_hours

    if not suite_paths:
        return [("No GPU suite results", note(
            "benchmarks/results/ holds no result of benchmarks/gpu_suite.py; run it on the GPU "
            "type you will use and commit the JSON it writes."))]  # fmt: skip
    sections = []
    for path in suite_paths:
        suite = gpu_hours.load_suite(path)
        name = Path(path).name
        intro = note(html.escape(gpu_hours.describe(suite, gpu)) + ".")
        configs = [(f"this run ({run_config['model']['name']})", run_config)]
        configs.append((reference_name, reference))
        for label, cfg in configs:
            try:
                frame = gpu_hours.estimate(suite, cfg, gpu=gpu, cluster=cluster)
            except ValueError as err:
                body = note(html.escape(str(err)))
            else:
                body = table_html(frame)
            sections.append((f"{gpu}-hours of {label}, from {name}", intro + body))
        sections.append((f"GPU suite figures ({name})", intro + table_html(suite_table(suite))))
    return sections
