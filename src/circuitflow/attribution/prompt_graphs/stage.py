"""The prompt_graphs job of one behaviour: a replacement graph for each
of the first `attribution.prompt_graphs` prompts, pruned, split over heads, validated on the
model and written as circuit-tracer graph files, with `summary.json`, the kept features'
top-activating contexts beside them, and the page that draws them (see docs/outputs.md)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from circuitflow.attribution import contexts
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.page import browser_href
from circuitflow.attribution.prompt_graphs import (
    files,
    heads,
    page,
    prune,
    replacement,
    validate,
)
from circuitflow.devices import resolve_device
from circuitflow.errors import InputError
from circuitflow.features.read import read_labels
from circuitflow.io import write_json, write_parquet, write_text
from circuitflow.nodes import site_layer
from circuitflow.perf import PassCounter
from circuitflow.prompts import read_prompts

log = logging.getLogger(__name__)
SUMMARY = "summary.json"
INDEX = "graph-metadata.json"
CONTEXTS = "feature_contexts.parquet"


# circuit-tracer's own transcoder sets, by the SAELens conversion of their releases: their
# graph files' scan is the release's Hugging Face repository (circuit-tracer's hf_ref).
CIRCUIT_TRACER_CONVERSIONS = ("mwhanna_transcoder",)


def scan_of(config: dict, transcoder_dirs: list[Path | str]) -> tuple[str, list[str]]:
    """The graph files' (metadata.scan, metadata.transcoder_list): attribution.prompt_graph_scan
    where set; else the repository of a circuit-tracer release the transcoders all come from
    (their metrics.json: repo_id, conversion); either with an empty transcoder_list, as
    circuit-tracer writes a named set. Otherwise model.name and the transcoders' folders."""
    names = [str(Path(d)) for d in transcoder_dirs]
    if config["attribution"].get("prompt_graph_scan"):
        return config["attribution"]["prompt_graph_scan"], []
    repos = set()
    for d in transcoder_dirs:
        path = Path(d) / "metrics.json"
        metrics = json.loads(path.read_text()) if path.is_file() else {}
        published = metrics.get("conversion") in CIRCUIT_TRACER_CONVERSIONS
        repos.add(metrics.get("repo_id") if published else None)
    if len(repos) == 1 and None not in repos:
        return repos.pop(), []
    return config["model"]["name"], names


def load_transcoders(dirs: list[Path | str], device) -> dict[int, Any]:
    """layer -> transcoder, from SAELens directories; an SAE is refused in one line."""
    from circuitflow.sae.files import load_sae
    from circuitflow.sae.transcoder import hook_out, is_transcoder

    out = {}
    for d in dirs:
        tc = load_sae(d, device)
        if not is_transcoder(tc):
            raise InputError(f"{d}: an SAE; prompt graphs need transcoders (sae.kind transcoder)")
        out[site_layer(hook_out(tc))[1]] = tc
    return dict(sorted(out.items()))


def linearity_error(graph: replacement.PromptGraph) -> float:
    """The largest |incoming edges + bias terms - input| over the graph's targets (features
    and the logit): 0 up to float32 rounding when the replacement model is linear."""
    targets = torch.cat([torch.arange(graph.n_features), torch.tensor([graph.logit_index])])
    recon = graph.adjacency[targets].double().sum(1) + graph.biases[targets].double()
    return float((recon - graph.inputs[targets].double()).abs().max())


def token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token]) if tokenizer is not None else str(token)


def describe(graph, pruned: prune.Pruned, scores: dict, n_active: int) -> dict[str, Any]:
    """One graph's row of summary.json."""
    kinds = graph.kinds()
    tokens = torch.tensor([k == "token" for k in kinds])
    token_influence = pruned.node_influence[tokens]
    top = int(token_influence.argmax())
    return {
        "metric": graph.metric,
        "n_active_features": n_active,
        "n_features": graph.n_features,
        "dropped_features": graph.dropped_features,
        "n_nodes": graph.n_nodes,
        "n_edges": int((graph.adjacency != 0).sum()),
        "kept_nodes": int(pruned.node_mask.sum()),
        "kept_features": int(pruned.node_mask[: graph.n_features].sum()),
        "kept_edges": int(pruned.edge_mask.sum()),
        **scores,
        "linearity_max_abs_error": linearity_error(graph),
        "top_token_position": top,
        "top_token": graph.tokens[top],
        "top_token_influence": float(token_influence[top]),
        "forward_equivalents": sum(graph.passes.values()),
    }


def run(
    config: dict,
    behaviour: str,
    prompts_path: Path | str,
    model_json: Path | str,
    transcoder_dirs: list[Path | str],
    out_dir: Path | str,
    page_path: Path | str | None = None,
    feature_dirs: list[Path | str] = (),
    features_html: Path | str | None = None,
) -> dict[str, Any]:
    """Write `out_dir` (replaced whole, atomically): the graph files, graph-metadata.json,
    summary.json, feature_contexts.parquet (the kept features' top contexts from the features
    stage's `feature_dirs`, which also label the features; empty without them); then
    `page_path` (default: `out_dir` with .html), the page, whose feature nodes open their cards
    from the feature browser whose index is `features_html` (none without); return the
    summary."""
    from circuitflow.model.load import load_model

    cfg = AttributionConfig.from_dict(config["attribution"])
    prompts = read_prompts(prompts_path).head(cfg.prompt_graphs)
    # Each feature's label (clerp) from the features stage's transcoder folders, by layer.
    labels = {layer: by_feature for (_, layer), by_feature in read_labels(feature_dirs).items()}
    device = resolve_device(config["device"])
    transcoders = load_transcoders(transcoder_dirs, device)
    # float32 whatever model.dtype: every edge is a number a user reads.
    model = load_model(Path(model_json).parent, device, "float32")
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = getattr(model, "tokenizer", None)
    # Layers outside `layers` have no transcoder: their MLPs are whole error nodes in every graph.
    whole = sorted(set(range(model.cfg.n_layers)) - set(transcoders))
    if whole:
        log.warning(
            "the MLPs of layers %s have no transcoder: each graph holds their whole output as "
            "error nodes (mlps_without_transcoders in summary.json)", whole,
        )  # fmt: skip
    skip_bos = bool(config["capture"]["exclude_bos"])
    scan, names = scan_of(config, transcoder_dirs)
    # Each layer's Neuronpedia id, where its transcoder names one (a published release's).
    neuronpedia = {layer: tc.cfg.metadata.neuronpedia_id for layer, tc in transcoders.items()
                   if getattr(tc.cfg.metadata, "neuronpedia_id", None)}  # fmt: skip
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    counter = PassCounter()
    rows, written, pages = [], [], []
    kept: dict[int, set[int]] = {}
    try:
        for row in tqdm(prompts.itertuples(), total=len(prompts), desc=f"{behaviour} graphs"):
            toks = [int(t) for t in row.clean_tokens]
            answer, distractor = int(row.answer_id), int(row.distractor_id)
            graph = replacement.build(
                model, transcoders, toks, answer, distractor,
                skip_bos=skip_bos, max_feature_nodes=cfg.max_feature_nodes,
                batch_size=cfg.prompt_graph_batch_size,
            )  # fmt: skip
            kinds = graph.kinds()
            pruned = prune.prune(
                graph.adjacency, kinds, cfg.prompt_graph_node_threshold,
                cfg.prompt_graph_edge_threshold,
            )  # fmt: skip
            edge_heads = heads.split_edges(graph, pruned.edge_mask, cfg.prompt_graph_edge_heads,
                                           cfg.prompt_graph_batch_size,
                                           cfg.prompt_graph_split_targets,
                                           pruned.node_influence)  # fmt: skip
            checked = validate.validate(graph, pruned.node_mask, pruned.node_influence,
                                        cfg.prompt_graph_validation_features,
                                        cfg.spearman_threshold)  # fmt: skip
            for part, value in graph.passes.items():
                with counter.part(part):
                    counter.forward(int(value))
            scores = prune.scores(graph.adjacency, kinds)
            n_active = graph.n_features + graph.dropped_features
            summary = describe(graph, pruned, scores, n_active)
            summary["validation"] = checked
            if n_active == 0:
                log.warning(
                    "%s-%s: no active features (no transcoder latent fires on the prompt): "
                    "the graph is its tokens, error nodes and logit; faithfulness and spearman "
                    "undefined", behaviour, row.prompt_id,
                )  # fmt: skip
            if checked["passed"] is False:
                log.warning(
                    "%s-%s: the graph's predicted feature ablations agree poorly with the "
                    "model's (spearman %.3f < %.2f)", behaviour, row.prompt_id,
                    checked["spearman"], cfg.spearman_threshold,
                )  # fmt: skip
            slug = f"{behaviour}-{row.prompt_id}"
            prob = graph.answer_prob
            text = [token_text(tokenizer, t) for t in toks]
            content = files.graph_file(
                graph, pruned, slug=slug, scan=scan, transcoder_list=names,
                prompt_tokens=text, prompt=" ".join(text[1:]) if tokenizer is None
                else tokenizer.decode(toks[1:]),
                node_threshold=cfg.prompt_graph_node_threshold,
                answer_text=token_text(tokenizer, answer),
                distractor_text=token_text(tokenizer, distractor), answer_prob=prob,
                extra={"behaviour": behaviour, "prompt_id": int(row.prompt_id),
                       "answer": answer, "distractor": distractor, **summary},
                edge_heads=edge_heads, labels=labels, neuronpedia=neuronpedia,
            )  # fmt: skip
            write_json(tmp / f"{slug}.json", content)
            written.append(content)
            rows.append({"prompt_id": int(row.prompt_id), "slug": slug, **summary})
            pages.append(page.graph_data(graph, pruned, edge_heads, text, rows[-1], labels,
                                         neuronpedia))  # fmt: skip
            for i in torch.nonzero(pruned.node_mask[: graph.n_features]).flatten().tolist():
                layer, _, feat = graph.features[i].tolist()
                kept.setdefault(layer, set()).add(feat)
            log.info(
                "%s: %d of %d features kept, replacement %.3f, completeness %.3f, "
                "linearity error %.1e",
                slug, summary["kept_features"], graph.n_features, scores["replacement_score"],
                scores["completeness_score"], summary["linearity_max_abs_error"],
            )  # fmt: skip
        write_json(tmp / INDEX, files.index(written))
        # The features stage's contexts: no pass over the token set here.
        wanted = {("mlp_out", layer): feats for layer, feats in kept.items()}
        found = contexts.top_contexts(feature_dirs, wanted, cfg.n_contexts, tokenizer)
        write_parquet(tmp / CONTEXTS, found)
        title = f"{behaviour}: per-prompt attribution graphs"
        html = page.page_html(title, pages, found, cfg.prompt_graph_node_threshold,
                              cfg.prompt_graph_edge_threshold,
                              browser_href(page_path or out_dir.with_suffix(".html"),
                                           features_html))  # fmt: skip
        result = {
            "behaviour": behaviour,
            "graphs": rows,
            "replacement_score_mean": _mean(rows, "replacement_score"),
            "completeness_score_mean": _mean(rows, "completeness_score"),
            "linearity_max_abs_error": max(
                (r["linearity_max_abs_error"] for r in rows), default=None
            ),  # fmt: skip
            "faithfulness_mean": _mean([r["validation"] for r in rows], "faithfulness"),
            "validation_spearman_mean": _mean([r["validation"] for r in rows], "spearman"),
            "validation_flagged": [r["slug"] for r in rows if r["validation"]["passed"] is False],
            "mlps_without_transcoders": whole,
            "settings": {
                "node_threshold": cfg.prompt_graph_node_threshold,
                "edge_threshold": cfg.prompt_graph_edge_threshold,
                "max_feature_nodes": cfg.max_feature_nodes,
                "skip_bos": skip_bos,
                "scan": scan,
            },
            "neuronpedia": {str(layer): np_id for layer, np_id in neuronpedia.items()},
            **counter.summary(len(rows), unit="prompt graph"),
        }
        write_json(tmp / SUMMARY, result)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
        write_text(page_path or out_dir.with_suffix(".html"), html)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return result


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return sum(values) / len(values) if values else None
