"""The attribution stage for one behaviour: node scores, their validation, the graph, figures and
feature contexts.

Steps: `plan` (the batch size the memory plan allows), `score` (every node by the fast method,
the exact reference on a subset, validation), `build_graph` (top nodes and edges), `contexts`
(the top features' top activating contexts, read from the features stage), `write` (tables,
figures, graph.json last).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow.attribution import contexts as feature_contexts
from circuitflow.attribution import graph as circuit_graph
from circuitflow.attribution import plots, scores
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.page import graph_html
from circuitflow.io import save_figure, write_json, write_parquet, write_text

log = logging.getLogger(__name__)


def plan(
    model, prompts: pd.DataFrame, saes: dict[str, Any], cfg: AttributionConfig, behaviour: str
):
    """(`cfg` with the batch size the memory plan allows, the plan)."""
    batch = scores.plan_attribution_batch(model, prompts, saes, cfg)
    if batch.batch_size < cfg.batch_size:
        log.warning(
            "%s: attribution.batch_size %d lowered by the %s",
            behaviour,
            cfg.batch_size,
            batch.describe(),
        )
        cfg = replace(cfg, batch_size=batch.batch_size)
    return cfg, batch


@dataclass
class Scored:
    scores: scores.NodeScores
    frame: pd.DataFrame  # every node, `score` = exact where computed, else the fast method
    validation: dict[str, Any]


def score(
    model,
    prompts: pd.DataFrame,
    saes: dict[str, Any],
    cfg: AttributionConfig,
    behaviour: str,
    bypass_bos: bool = False,
) -> Scored:
    node_scores = scores.score_nodes(model, prompts, saes, cfg, bypass_bos)
    validation = scores.validation(node_scores.frame, cfg.method, cfg.spearman_threshold)
    pooled = {"spearman": validation["spearman"], "passed": validation["passed_all_nodes"]}
    if validation["spearman"] is None:
        log.warning("%s: %s's validation against exact patching is undefined: %s", behaviour,
                    cfg.method, validation["spearman_undefined"])  # fmt: skip
    for kind, result in [("all nodes", pooled), *validation["by_kind"].items()]:
        if result["passed"] is False:
            log.warning(
                "%s: %s agrees poorly with exact patching on %s (spearman %.3f < %.2f)",
                behaviour,
                cfg.method,
                kind,
                result["spearman"],
                cfg.spearman_threshold,
            )
    return Scored(node_scores, scores.with_score(node_scores.frame, cfg.method), validation)


def build_graph(
    prompts: pd.DataFrame,
    scored: Scored,
    cfg: AttributionConfig,
    meta: dict[str, Any],
    labels: dict | None = None,
    neuronpedia: dict | None = None,
) -> dict[str, Any]:
    """graph.json: the top nodes (features with their `labels`, features.read.read_labels, and
    Neuronpedia pages, `neuronpedia` = features.read.read_neuronpedia_ids),
    the direct-effect edges between them (on the validation prompts) and their validation
    against exact direct-path patching, `meta` (timings added here)."""
    sp = scored.scores.spliced
    validation = scores.validation_prompts(prompts, cfg)
    t0 = time.perf_counter()
    nodes = circuit_graph.select_nodes(scored.frame, cfg)
    with sp.counter.part("edges"):
        edges = circuit_graph.compute_edges(sp, validation, nodes, cfg, scored.scores.kept)
    meta["seconds"]["edges"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with sp.counter.part("edge_validation"):
        meta["edge_validation"] = (
            circuit_graph.validate_edges(sp, validation, nodes, edges, cfg)
            if cfg.validation_edges
            else None
        )
    meta["seconds"]["edge_validation"] = time.perf_counter() - t0
    meta["n_validation_prompts"] = len(validation)
    graph = circuit_graph.build_graph(nodes, edges, cfg, sp.model.cfg.n_layers, meta, labels,
                                      neuronpedia)  # fmt: skip
    # What node pruning saw: graph.html's node threshold control measures shares of this total.
    graph["score_abs_total"] = float(scored.frame["score"].abs().sum())
    graph["n_nodes_scored"] = len(scored.frame)
    return graph


def contexts(
    features: pd.DataFrame,
    feature_dirs: list[Path | str],
    tokenizer: Any,
    cfg: AttributionConfig,
    graph_nodes: list[dict[str, Any]] | None = None,
) -> pd.DataFrame:
    """Top activating contexts of each SAE's top `context_features` features and of every
    feature among `graph_nodes` (graph.json's), whose hover cards in graph.html show them, read
    from the features stage's folders (`feature_dirs`; contexts.top_contexts): no pass here."""
    ranked = features[features["kind"] == "feature"]  # by |score|, best first
    wanted: dict[tuple[str, int], set[int]] = {}
    for (site, layer), sub in ranked.groupby(["site", "layer"], sort=False):
        top = sub.head(cfg.context_features)["feature"].astype(int)
        wanted[(site, int(layer))] = set(top.tolist())
    for n in graph_nodes or []:
        if n["kind"] == "feature":
            wanted.setdefault((n["site"], int(n["layer"])), set()).add(int(n["index"]))
    return feature_contexts.top_contexts(feature_dirs, wanted, cfg.n_contexts, tokenizer)


def write(
    out: Path,
    tables: dict[str, pd.DataFrame],
    graph: dict[str, Any],
    summary: dict[str, Any],
    model_cfg,
    cfg: AttributionConfig,
    behaviour: str,
    labels: dict | None = None,
) -> None:
    for name, table in tables.items():
        write_parquet(out / f"{name}.parquet", table)
    heatmap = plots.head_heatmap(
        tables["heads"], model_cfg.n_layers, model_cfg.n_heads, f"{behaviour}: head effects"
    )
    save_figure(out / "heads.png", heatmap)
    top = plots.top_features(
        tables["features"], cfg.top_features_plot, f"{behaviour}: top SAE features", labels
    )
    save_figure(out / "features.png", top)
    page = graph_html(graph, f"{behaviour} circuit", tables["feature_contexts"])
    write_text(out / "graph.html", page)
    write_json(out / "summary.json", summary)
    write_json(out / "graph.json", graph)  # last: the rule's main output


def attribute(
    model,
    prompts: pd.DataFrame,
    saes: dict[str, Any],
    tokenizer: Any,
    cfg: AttributionConfig,
    behaviour: str,
    out_dir: Path | str,
    bypass_bos: bool = False,
    feature_dirs: list[Path | str] = (),
) -> dict[str, Any]:
    """Write heads.parquet, features.parquet, components.parquet, feature_contexts.parquet,
    graph.json, summary.json, heads.png, features.png and graph.html into `out_dir`. Each
    feature's label and top contexts come from the features stage's folders of the SAEs
    (`feature_dirs`; none without them), its contexts' text decoded with `tokenizer`.
    `bypass_bos`: the SAEs were trained without BOS, so they are bypassed there."""
    from circuitflow.features.read import read_labels, read_neuronpedia_ids

    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    cfg, batch = plan(model, prompts, saes, cfg, behaviour)
    t0 = time.perf_counter()
    scored = score(model, prompts, saes, cfg, behaviour, bypass_bos)
    tables = {
        "heads": scores.heads_table(scored.frame),
        "features": scores.features_table(scored.frame),
        "components": scores.components_table(scored.frame),
    }
    ns = scored.scores
    meta = {
        "behaviour": behaviour,
        "method": cfg.method,
        "metric": "logit_diff (answer - distractor, last position)",
        "metric_clean": ns.metric_clean,
        "metric_corrupted": ns.metric_corrupted,
        "n_prompts": ns.n_prompts,
        "bypass_bos": bypass_bos,  # the SAEs were trained without BOS: bypassed there
        "validation": scored.validation,
        "config": asdict(cfg),  # batch_size as run (the memory plan may lower it)
        "memory_plan": batch.describe(),
        "seconds": dict(ns.seconds),
    }
    labels = read_labels(feature_dirs)  # each feature's, from the features stage
    graph = build_graph(prompts, scored, cfg, meta, labels, read_neuronpedia_ids(feature_dirs))
    meta["seconds"]["total"] = time.perf_counter() - t0
    meta["seconds_per_prompt"] = meta["seconds"]["total"] / max(ns.n_prompts, 1)
    cost = ns.spliced.counter.summary(ns.n_prompts)
    meta |= cost
    graph |= {"seconds": meta["seconds"], "seconds_per_prompt": meta["seconds_per_prompt"]}
    graph |= cost
    tables["feature_contexts"] = contexts(
        tables["features"], feature_dirs, tokenizer, cfg, graph["nodes"]
    )
    heads = tables["heads"]
    # Patching it from the corrupted prompt changes nothing: it carries no clean/corrupted
    # difference (a pruned head, W_O = 0, or one the corruption does not move). Whether the
    # behaviour needs it is the interventions' `inert_heads` (its own ablation).
    same = heads["score"] == 0
    summary = meta | {
        "top_heads": heads[~same].head(5)[["layer", "head", "score"]].to_dict("records"),
        "no_difference_heads": [
            f"L{int(r.layer)}H{int(r.head)}"
            for r in heads[same].sort_values(["layer", "head"]).itertuples()
        ],
        "top_components": tables["components"]
        .head(5)[["kind", "layer", "index", "score"]]
        .to_dict("records"),
        "n_graph_nodes": len(graph["nodes"]),
        "n_graph_edges": len(graph["edges"]),
    }
    write(Path(out_dir), tables, graph, summary, model.cfg, cfg, behaviour, labels)
    log.info(
        "%s: %d prompts, spearman %s, %.2f s per prompt",
        behaviour,
        ns.n_prompts,
        scored.validation["spearman"],
        meta["seconds_per_prompt"],
    )
    return summary


def headline(summary: dict[str, Any]) -> str:
    """The script's one line: the top heads (inert ones left out) and the validation's verdict
    (`n/a` for a number the summary does not have)."""
    val = summary["validation"]
    top = ", ".join(f"L{h['layer']}H{h['head']} {h['score']:.2f}" for h in summary["top_heads"])
    verdict = {True: "passed", False: "failed"}.get(val["passed"], "not judged")
    failed = val.get("failed_kinds") or []
    if failed:
        verdict += f" ({', '.join(failed)} below the threshold)"
    rho = "n/a" if val["spearman"] is None else f"{val['spearman']:.3f}"
    return (
        f"{summary['behaviour']}: top heads {top or 'none'}; validation spearman {rho}, {verdict}"
    )


def run(
    config: dict,
    behaviour: str,
    prompts_path: Path | str,
    model_json: Path | str,
    sae_dirs: list[Path | str],
    activation_files: list[Path | str],
    out_dir: Path | str,
    feature_dirs: list[Path | str] = (),
) -> dict[str, Any]:
    """The stage: load the model, prompts and SAEs named by the rule, then `attribute`. Each
    feature's label and top contexts come from `feature_dirs` (the features stage's folders of
    the SAEs). The SAEs' activation files (`sae.source: capture`) say whether their rows leave
    BOS out; without them (stream, pretrained) `capture.exclude_bos` does."""
    from circuitflow.attribution.splice import load_saes
    from circuitflow.capture.files import read_activation_info
    from circuitflow.devices import precise_math
    from circuitflow.errors import ConfigError
    from circuitflow.model.load import load_for_analysis, load_tokenizer
    from circuitflow.prompts import read_prompts
    from circuitflow.sae.files import check_sae_dir

    if activation_files and len(sae_dirs) != len(activation_files):
        raise ConfigError("--saes and --activations must name the same number of paths")
    cfg = AttributionConfig.from_dict(config["attribution"])
    prompts = read_prompts(prompts_path)
    # Pair SAEs with activation files by the hook each names, not by argument order alone.
    infos = [read_activation_info(a) for a in activation_files]
    # The SAEs were trained on these rows: bypassed at BOS when the rows leave BOS out.
    if infos:
        bypass_bos = any(info.bos_excluded for info in infos)
    else:
        bypass_bos = bool(sae_dirs) and bool(config["capture"]["exclude_bos"])
    for d in sae_dirs:  # before the model: a damaged SAE is refused in a second
        check_sae_dir(d)
    model_dir = Path(model_json).parent
    model = load_for_analysis(model_dir, config["device"])
    saes = load_saes(sae_dirs, next(model.parameters()).device)
    missing = sorted(set(saes) - {info.hook_name for info in infos}) if infos else []
    if missing:
        raise ConfigError(f"--activations: no activation file for the SAE at {missing[0]}")
    # Float32 without TF32 in every pass, the fast one too: its clean metric is exact
    # patching's base and its gradients weight the edges (scores.Kept). With TF32 emulated on
    # the default run (every float32 matmul's inputs rounded to 10 mantissa bits), the fast
    # pass alone moved exact head scores by up to 5e-4 and flipped induction's head agreement
    # (-0.50 to 0.91); every pass moved feature scores by up to 0.022 and dropped a graph edge.
    with precise_math():
        tokenizer = load_tokenizer(model_dir)
        return attribute(
            model, prompts, saes, tokenizer, cfg, behaviour, out_dir, bypass_bos, feature_dirs
        )
