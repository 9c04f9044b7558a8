"""The interventions stage: test what attribution claims by changing the model and measuring
the behaviour.

Metric m: mean logit difference (answer - distractor, last position) over the behaviour's clean
prompts. M is the unmodified model; ablations use one kind (`zero`, `mean`, `resample`, see
`ablation.py`), recorded in every table and in summary.json.

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
  Beside a circuit of features, the same search over the components alone gives the component
  circuit (component_circuits.parquet, summary.json's `component_circuit`): components are
  shared by every prompt, while residual features are token-specific and a circuit of them can
  overfit its selection prompts, so the report leads with the component circuit's held-out
  faithfulness.
* Heads. Every head alone; every pair and triplet (up to `max_set_size`) among the top-k heads by
  attribution, with the additive prediction (sum of single effects) and the interaction, and
  random head sets of each size as the control. Inert heads (score exactly 0, such as the
  embedded model's pruned heads) are left out of the top heads: sets of them only repeated
  the sets without them.
* Features. The top features by attribution, ablated, next to random active features of the same
  SAE; and steered: alpha * W_dec[f] added at the feature's site, next to a random direction of
  the same norm, with the top tokens whose mean logit rises most.

Statistics: effects are m(M) - m(ablated) (`score`, positive = the node supports the answer, as
in attribution), as a share of m(M) (`drop_frac`), the change in accuracy (answer beats
distractor) and in calibration error. Each is repeated over `n_seeds` seeds, each a bootstrap
resample of the prompts (and, for resample ablation, a new draw of the corrupted prompts):
columns `<x>` hold the mean across seeds, `<x>_std` the std; `score_ci_low/high` is a
t-interval over prompts on the full set, `p_value` a paired t-test against no effect.

Flags (flags.py): summary.json says where a random control reaches its circuit's value and
where a faithfulness falls under the threshold (held out, or the attribution graph's own).

Steps: `read_attribution` (the attribution stage's tables and graph), `circuits`, `heads`,
`features` (each in its module), `write` (tables, figures, summary.json last), `summarise` and
`headline` (the script's line).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow.batching import selection_half
from circuitflow.interventions import circuits as circ
from circuitflow.interventions import features as feat
from circuitflow.interventions import flags, plots
from circuitflow.interventions import heads as hd
from circuitflow.interventions.ablation import Intervener
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.stats import Runs, seeds_for
from circuitflow.io import save_figure, write_json, write_parquet
from circuitflow.nodes import component_nodes, site_layer
from circuitflow.perf import PassCounter

log = logging.getLogger(__name__)
METRIC = "logit_diff (answer - distractor, last position), mean over prompts"


@dataclass
class AttributionResults:
    """What the attribution stage wrote for the behaviour (None where a file is absent)."""

    heads: pd.DataFrame | None
    components: pd.DataFrame | None
    features: pd.DataFrame | None
    graph: dict[str, Any] | None


# What interventions read from each attribution output (the score column is the method's).
ATTRIBUTION_TABLES = {
    "heads": ("layer", "head", "score"),
    "components": ("kind", "layer", "index", "score", "score_selection"),
    "features": ("kind", "site", "layer", "feature", "score", "score_selection"),
}


def read_attribution(attr_dir: Path | str, required: bool = False) -> AttributionResults:
    """The attribution stage's tables and graph.json in `attr_dir`, each checked (InputError
    naming the file when unreadable or missing a column). An absent file reads as None unless
    `required` (the stage: the rule names all four)."""
    from circuitflow import inputs

    attr_dir = Path(attr_dir)
    rerun = f"attribution for {attr_dir}"

    def table(name: str) -> pd.DataFrame | None:
        path = attr_dir / f"{name}.parquet"
        if not required and not path.exists():
            return None
        return inputs.parquet_table(
            path, ATTRIBUTION_TABLES[name], rerun, what=f"attribution {name} table"
        )

    graph_path = attr_dir / "graph.json"
    graph = (
        inputs.json_file(graph_path, ("nodes",), rerun, what="attribution graph")
        if required or graph_path.exists()
        else None
    )
    return AttributionResults(table("heads"), table("components"), table("features"), graph)


@dataclass
class Circuits:
    curves: pd.DataFrame
    ranked: list  # candidate nodes by |attribution score| on the selection half
    size: int | None  # the circuit size reported; None when no size is faithful
    smallest: int | None  # the smallest faithful size (selection half)
    features_as_nodes: bool
    selection: Any  # mask over prompts: the selection half
    component_curves: pd.DataFrame  # the curves over the components alone
    component_ranked: list  # the components by |attribution score| on the selection half


def circuits(
    runs: Runs,
    attr: AttributionResults,
    saes: dict[str, Any],
    cfg: InterventionsConfig,
    model_cfg,
    base_seed: int,
    selection,
) -> Circuits:
    """Candidates ranked by attribution on the selection half, the curves over circuit sizes,
    the smallest faithful size on the selection half (grid, then bisection) and the attribution
    graph's own node set as a circuit; beside a circuit of features, the same over the
    components alone (the component circuit)."""
    active = None
    if attr.components is not None and len(attr.components):
        if cfg.circuit_nodes == "features" and saes:
            active = {site_layer(h): feat.active_features(runs.iv, h) for h in saes}
        ranked = circ.ranked_nodes(attr.components, attr.features, active)
    else:
        ranked = component_nodes(model_cfg.n_layers, model_cfg.n_heads)
    claimed = circ.graph_nodes(attr.graph, ranked)
    sizes = circ.circuit_sizes(len(ranked), cfg, [cfg.circuit_size])
    curves = circ.circuit_curves(runs, ranked, sizes, cfg, base_seed, selection, named=claimed)
    curves = circ.refine_smallest(runs, ranked, curves, cfg, base_seed, selection)
    smallest = circ.smallest_faithful(curves, cfg.faithfulness_threshold)
    size = cfg.circuit_size if cfg.circuit_size is not None else smallest
    size = min(size, len(ranked)) if size is not None else None
    comp_ranked, comp_curves = ranked, curves
    if active:  # features are candidates: the component circuit is a second search
        comp_ranked = circ.ranked_nodes(attr.components)
        sizes = circ.circuit_sizes(len(comp_ranked), cfg, [])
        # Random controls at the size it finds only (refine_smallest): no figure draws this
        # search's curves.
        comp_curves = circ.circuit_curves(
            runs, comp_ranked, sizes, cfg, base_seed, selection, controls=False
        )
        comp_curves = circ.refine_smallest(
            runs, comp_ranked, comp_curves, cfg, base_seed, selection
        )
    return Circuits(
        curves, ranked, size, smallest, bool(active), selection, comp_curves.copy(), comp_ranked
    )


def _scored_heads(attr: AttributionResults, singles: pd.DataFrame) -> pd.DataFrame:
    """Heads with the score that picks the top heads: attribution's (the ablation effect when
    attribution has none)."""
    return attr.heads if attr.heads is not None and len(attr.heads) else singles


def inert_heads(attr: AttributionResults, singles: pd.DataFrame) -> list[tuple[int, int]]:
    """Heads whose score is exactly 0, such as pruned heads (W_O = 0): nothing to test, so they
    are left out of the top heads and the head sets."""
    heads = _scored_heads(attr, singles)
    return sorted((int(r.layer), int(r.head)) for r in heads[heads["score"] == 0].itertuples())


def top_heads(attr: AttributionResults, singles: pd.DataFrame, k: int) -> list[tuple[int, int]]:
    """The k heads by |attribution score| (by ablation effect when attribution has none),
    inert heads (score exactly 0) left out."""
    heads = _scored_heads(attr, singles)
    heads = heads[heads["score"] != 0]
    order = heads.reindex(heads["score"].abs().sort_values(ascending=False).index)
    return [(int(r.layer), int(r.head)) for r in order.head(k).itertuples()]


def write(
    out: Path, tables: dict[str, pd.DataFrame], cfg: InterventionsConfig, model_cfg, behaviour: str
) -> None:
    for frame in tables.values():
        frame.insert(0, "ablation", cfg.ablation)
    for name, frame in tables.items():
        write_parquet(out / f"{name}.parquet", frame)
    title = f"{behaviour} ({cfg.ablation} ablation)"
    figures = {
        "faithfulness.png": plots.circuit_curves(
            tables["circuits"], cfg.faithfulness_threshold, title
        ),
        "heads.png": plots.head_heatmap(
            tables["heads"], model_cfg.n_layers, model_cfg.n_heads, title
        ),
        "head_sets.png": plots.head_sets(tables["head_sets"], title),
        "steering.png": plots.steering(tables["steering"], title),
    }
    for name, fig in figures.items():
        save_figure(out / name, fig)


def summarise(
    behaviour: str,
    cfg: InterventionsConfig,
    runs: Runs,
    c: Circuits,
    singles: pd.DataFrame,
    top: list[tuple[int, int]],
    n_prompts: int,
    seconds: dict[str, float],
    inert: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """summary.json (every number from the tables the stage wrote), with the flags on its
    headline numbers (flags.py). `inert`: the heads left out of the top heads."""
    curves, ranked, size, smallest = c.curves, c.ranked, c.size, c.smallest
    top_rows = curves[curves["circuit"] == "top"].drop_duplicates("n").set_index("n")

    def at(n: int | None, column: str) -> float | None:
        return float(top_rows.loc[n, column]) if n is not None else None

    def band(column: str, n: int | None) -> float | None:
        b = circ.random_band(curves, column)
        return float(b.loc[n, "mean"]) if n is not None and n in b.index else None

    def nodes(n: int | None) -> list[str] | None:
        return None if n is None else [node.id for node in ranked[:n]]

    if cfg.circuit_size is not None:
        source = "config"
    elif smallest is not None:
        source = "smallest faithful on the selection half"
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
        "inert_heads": [hd.head_label(*h) for h in inert or []],
        "n_runs": runs.n_runs,
        "config": asdict(cfg),
        "seconds": seconds,
    }
    for column in ("faithfulness", "completeness", "faithfulness_heldout", "completeness_heldout"):
        curve = {int(n): float(v) for n, v in top_rows[column].items()}
        summary[column.replace("ness", "ness_curve", 1)] = curve
    return flags.with_flags(summary)


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
    if s["circuit_size"] is None:
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


def intervene(
    model,
    prompts: pd.DataFrame,
    attribution_dir: Path | str,
    saes: dict[str, Any],
    tokenizer: Any,
    cfg: InterventionsConfig,
    behaviour: str,
    out_dir: Path | str,
    base_seed: int = 0,
    bypass_bos: bool = False,
) -> dict[str, Any]:
    """Write circuits.parquet, component_circuits.parquet, heads.parquet, head_sets.parquet,
    features.parquet, steering.parquet, the figures and summary.json (last) into `out_dir`.
    `bypass_bos`: the SAEs were trained without BOS, so they are bypassed there (as in
    attribution)."""
    t0 = time.perf_counter()
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    prompts = prompts.reset_index(drop=True)
    attr = read_attribution(attribution_dir)
    counter = PassCounter()
    iv = Intervener(
        model,
        prompts,
        cfg.ablation,
        cfg.mean_reference,
        cfg.batch_size,
        saes,
        bypass_bos,
        cfg.runs_per_pass,
        counter,
    )
    with counter.part("circuits"):
        runs = Runs(iv, seeds_for(cfg, base_seed))
        c = circuits(runs, attr, saes, cfg, model.cfg, base_seed, selection_half(prompts))
    t_circuits = time.perf_counter() - t0
    with counter.part("heads"):
        singles = hd.single_heads(runs, model.cfg, attr.heads, cfg.ci_level)
        top = top_heads(attr, singles, cfg.top_k_heads)
        sets = hd.head_sets(runs, singles, top, cfg, model.cfg, base_seed)
    t_heads = time.perf_counter() - t0 - t_circuits
    with counter.part("features"):
        ablated, steering = feat.feature_interventions(
            runs, attr.features, saes, tokenizer, cfg, base_seed
        )
    t_total = time.perf_counter() - t0
    seconds = {
        "circuits": t_circuits,
        "heads": t_heads,
        "features": t_total - t_circuits - t_heads,
        "total": t_total,
    }

    tables = {
        "circuits": c.curves,
        "component_circuits": c.component_curves,
        "heads": singles,
        "head_sets": sets,
        "features": ablated,
        "steering": steering,
    }
    out = Path(out_dir)
    write(out, tables, cfg, model.cfg, behaviour)
    inert = inert_heads(attr, singles)
    summary = summarise(behaviour, cfg, runs, c, singles, top, len(prompts), seconds, inert)
    summary |= counter.summary(len(prompts))
    write_json(out / "summary.json", summary)  # last: the rule's main output
    log.info(
        "%s: at n=%s faithfulness %s (held out %s), completeness %s; %d runs, %.1f s",
        behaviour,
        c.size,
        summary["faithfulness"],
        summary["faithfulness_heldout"],
        summary["completeness"],
        runs.n_runs,
        t_total,
    )
    return summary


def run(
    config: dict,
    behaviour: str,
    prompts_path: Path | str,
    model_json: Path | str,
    attribution_dir: Path | str,
    sae_dirs: list[Path | str],
    out_dir: Path | str,
) -> dict[str, Any]:
    """The stage: load the model, prompts and SAEs named by the rule, then `intervene`."""
    from circuitflow.attribution.splice import load_saes
    from circuitflow.devices import precise_math
    from circuitflow.model.load import load_for_analysis, load_tokenizer
    from circuitflow.prompts import read_prompts
    from circuitflow.sae.files import check_sae_dir

    cfg = InterventionsConfig.from_dict(config["interventions"])
    prompts = read_prompts(prompts_path)
    # Every input checked before the model is loaded.
    graph = read_attribution(attribution_dir, required=True).graph
    for d in sae_dirs:  # before the model: a damaged SAE is refused in a second
        check_sae_dir(d)
    model_dir = Path(model_json).parent
    model = load_for_analysis(model_dir, config["device"])
    saes = load_saes(sae_dirs, next(model.parameters()).device)
    # As attribution spliced the SAEs (it read how they were trained from the activations).
    with precise_math():
        return intervene(
            model,
            prompts,
            attribution_dir,
            saes,
            load_tokenizer(model_dir),
            cfg,
            behaviour,
            out_dir,
            int(config["seed"]),
            bool(graph.get("bypass_bos", False)),
        )


def across(
    behaviours: list[str], head_tables: list[Path | str], out: Path | str, out_figure: Path | str
) -> pd.DataFrame:
    """The interventions_across rule: single-head effects of every behaviour in one table."""
    from circuitflow.errors import ConfigError

    if len(behaviours) != len(head_tables):
        raise ConfigError("--behaviours and --heads must name the same number of items")
    tables = {b: pd.read_parquet(p) for b, p in zip(behaviours, head_tables, strict=True)}
    frame = hd.heads_across_behaviours(tables)
    save_figure(out_figure, plots.heads_across(frame))
    write_parquet(out, frame)
    return frame
