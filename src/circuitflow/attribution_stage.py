"""The attribution stage for one behaviour: node scores, validation, graph, figures, contexts."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow import attribution as attr
from circuitflow import circuit_graph, feature_context, plots_attribution
from circuitflow.io import save_figure, write_json, write_parquet, write_text

log = logging.getLogger(__name__)


def run(
    model,
    prompts: pd.DataFrame,
    saes: dict[str, Any],
    acts_files: dict[str, Path],
    tokenizer: Any,
    cfg: attr.AttributionConfig,
    behaviour: str,
    out_dir: Path | str,
) -> dict[str, Any]:
    """Write heads.parquet, features.parquet, components.parquet, feature_contexts.parquet,
    graph.json, summary.json, heads.png, features.png and graph.html into `out_dir`."""
    out = Path(out_dir)
    plan = attr.plan_batch_size(model, prompts, saes, cfg)
    if plan.batch_size < cfg.batch_size:
        log.warning(
            "%s: attribution.batch_size %d lowered by the %s",
            behaviour,
            cfg.batch_size,
            plan.describe(),
        )
        cfg = replace(cfg, batch_size=plan.batch_size)
    t0 = time.perf_counter()
    scores = attr.attribute(model, prompts, saes, cfg)
    frame = attr.with_score(scores.frame, cfg.method)
    validation = attr.validation(scores.frame, cfg.method, cfg.spearman_threshold)
    if validation["passed"] is False:
        log.warning(
            "%s: %s agrees poorly with exact patching (spearman %.3f < %.2f)",
            behaviour,
            cfg.method,
            validation["spearman"],
            cfg.spearman_threshold,
        )
    heads = attr.heads_table(frame)
    features = attr.features_table(frame)
    components = attr.components_table(frame)

    t1 = time.perf_counter()
    nodes = circuit_graph.select_nodes(frame, cfg)
    edges = circuit_graph.compute_edges(model, prompts, saes, scores.groups, nodes, cfg)
    t_edges = time.perf_counter() - t1
    timing = scores.seconds | {"edges": t_edges, "total": time.perf_counter() - t0}
    meta = {
        "behaviour": behaviour,
        "method": cfg.method,
        "metric": "logit_diff (answer - distractor, last position)",
        "metric_clean": scores.metric_clean,
        "metric_corrupted": scores.metric_corrupted,
        "n_prompts": scores.n_prompts,
        "validation": validation,
        "config": asdict(cfg),  # batch_size as run (the memory plan may lower it)
        "memory_plan": plan.describe(),
        "seconds": timing,
        "seconds_per_prompt": timing["total"] / max(scores.n_prompts, 1),
    }
    graph = circuit_graph.build_graph(nodes, edges, cfg, model.cfg.n_layers, meta)

    ctx_frames = []
    for hook, sae in saes.items():
        site, layer = attr.sae_site_layer(hook)
        sub = features[(features["layer"] == layer) & (features["site"] == site)]
        sub = sub[sub["kind"] == "feature"].head(cfg.context_features)
        ctx_frames.append(
            feature_context.contexts(
                acts_files[hook],
                sae,
                site,
                layer,
                sub["feature"].astype(int).tolist(),
                tokenizer,
                cfg.n_contexts,
                cfg.context_window,
                cfg.context_max_tokens,
            )
        )
    contexts = pd.concat(ctx_frames, ignore_index=True) if ctx_frames else pd.DataFrame()
    if contexts.empty:
        contexts = pd.DataFrame(columns=["site", "layer", "feature", "rank", "activation", "text"])

    write_parquet(out / "heads.parquet", heads)
    write_parquet(out / "features.parquet", features)
    write_parquet(out / "components.parquet", components)
    write_parquet(out / "feature_contexts.parquet", contexts)
    save_figure(
        out / "heads.png",
        plots_attribution.head_heatmap(
            heads, model.cfg.n_layers, model.cfg.n_heads, f"{behaviour}: head effects"
        ),
    )
    save_figure(
        out / "features.png",
        plots_attribution.top_features(
            features, cfg.top_features_plot, f"{behaviour}: top SAE features"
        ),
    )
    write_text(out / "graph.html", circuit_graph.graph_html(graph, f"{behaviour} circuit"))
    summary = meta | {
        "top_heads": heads.head(5)[["layer", "head", "score"]].to_dict("records"),
        "top_components": components.head(5)[["kind", "layer", "index", "score"]].to_dict(
            "records"
        ),
        "n_graph_nodes": len(graph["nodes"]),
        "n_graph_edges": len(graph["edges"]),
    }
    write_json(out / "summary.json", summary)
    write_json(out / "graph.json", graph)  # last: the rule's main output
    log.info(
        "%s: %d prompts, spearman %s, %.2f s per prompt",
        behaviour,
        scores.n_prompts,
        validation["spearman"],
        meta["seconds_per_prompt"],
    )
    return summary
