"""The stages of published dictionaries (`sae.source: pretrained`, or with sae.kind both
`sae.transcoders.source: pretrained`; sources and checks in `sae.pretrained`).

- prefetch_saes (a localrule, on the login node, which has internet): each site and layer's
  dictionary of a SAELens release fetched into the Hugging Face cache by SAE.from_pretrained,
  one at a time, checked against the model's model.json and for finite weights, and listed in
  prefetch.json.
- pretrained_sae (one job per group of sites and layers, grouped as the streaming jobs are:
  circuitflow.stream_groups): the model loaded once, then each member's dictionary in turn
  loaded offline (a release from the cache, a local directory as it is, a local copy of a
  release through its SAELens conversion), checked against the run, adapted where its model
  was loaded otherwise (`model_from_pretrained_kwargs`: center_writing_weights is folded into
  an SAE's encoder; a transcoder that read the MLP's input after the norm's weight gets the
  weight folded into its encoder, and reads site mlp_in), written to saes/{site}/layer_{layer}/
  in SAELens's format, reloaded from there and evaluated on the run's token set with the
  metrics train_sae writes (nothing is trained: tokens_trained 0; dead_fraction is the share of
  latents that never fire on the evaluation tokens; a transcoder replaces its MLP). Every
  later stage then reads it like a dictionary trained here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from circuitflow.errors import InputError
from circuitflow.io import sha256_files, write_json
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.plan import EVAL_BATCH
from circuitflow.sae.pretrained import (
    CFG_FILE,
    UNKNOWN,
    WEIGHTS_FILE,
    Dictionary,
    Loaded,
    RunModel,
    adapt_transcoder,
    check_finite,
    check_loaded,
    dictionaries,
    dictionary_for,
    differences,
    fold_centering,
    hub_cache_dir,
    load,
    model_kwargs_effect,
    view_of,
)
from circuitflow.sites import dictionary_kind

log = logging.getLogger(__name__)


def _model_info(model_json: Path | str) -> dict:
    from circuitflow.model.load import read_model_json

    return read_model_json(Path(model_json).parent)


def run_model_of(config: dict, info: dict) -> RunModel:
    """The run's model as model.json (`info`) describes it: its d_model, and its norms where
    it records them (a TransformerLens checkpoint's, None when it has none), else as the config
    plans them."""
    arch = info["architecture"]
    norms = arch["normalization_type"] if "normalization_type" in arch else UNKNOWN
    return RunModel.from_config(config, int(arch["d_model"]), norms)


def describe(d: Dictionary, loaded: Loaded) -> dict[str, Any]:
    """Where the dictionary came from and what it is, for prefetch.json and metrics.json."""
    view, rel = loaded.view, loaded.release
    out = {
        "site": d.site,
        "layer": d.layer,
        **d.describe(),
        "hook_name": view["hook_name"],
        "d_in": view["d_in"],
        "d_sae": view["d_sae"],
        "architecture": loaded.sae.cfg.architecture(),
        "model_name": view["model_name"],
        "model_from_pretrained_kwargs": view["model_from_pretrained_kwargs"],
        "neuronpedia_id": loaded.sae.cfg.metadata.neuronpedia_id,
    }
    if view.get("hook_name_out"):
        out |= {"hook_name_out": view["hook_name_out"], "d_out": view["d_out"]}
    if rel is not None:
        out |= {"repo_id": rel.repo_id, "folder": rel.folder, "revision": loaded.revision,
                "published": rel.published, "conversion": rel.conversion_func}  # fmt: skip
    elif d.converted:
        out["source_sha256"] = sha256_files(loaded.files)
    else:
        out["source_sha256"] = sha256_files([Path(d.path) / CFG_FILE, Path(d.path) / WEIGHTS_FILE])
    return out


# --- prefetch_saes --------------------------------------------------------------------------------
def prefetch_stage(config: dict, model_json: Path | str, out: Path | str) -> dict:
    """Rule prefetch_saes: fetch every configured dictionary of a release (sae.pretrained, and
    sae.transcoders with sae.kind both) into the hub cache (model.hf_cache, else the
    environment's), check each against the model, write prefetch.json."""
    SAETrainConfig.from_dict(config["sae"])  # a config given by hand is checked as the schema says
    info = _model_info(model_json)
    run = run_model_of(config, info)
    hf_cache = config["model"]["hf_cache"]
    rows = []
    releases = [d for d in dictionaries(config) if d.path is None]
    if not releases:
        raise InputError("sae.pretrained.path: local dictionaries need no prefetch_saes")
    for d in releases:
        loaded = load(d, hf_cache, "cpu", offline=None)  # the environment's network setting
        check_loaded(d, loaded, run, dictionary_kind(config, d.site))
        check_finite(d, loaded)
        rows.append(describe(d, loaded))
        del loaded  # one dictionary in memory at a time
    summary = {
        "releases": sorted({d.release for d in releases}),
        "hub_cache": str(hub_cache_dir(hf_cache)),
        "dictionaries": rows,
    }
    write_json(out, summary)
    return summary


# --- pretrained_sae -------------------------------------------------------------------------------
@torch.no_grad()
def firing(model, sae, contexts: torch.Tensor, hook: str, layer: int, keep_bos: bool,
           bos_token_id: int, counter) -> tuple[torch.Tensor, int]:  # fmt: skip
    """Which latents fire (non-zero) anywhere on the evaluation positions (BOS left out unless
    `keep_bos`), and how many positions there were. The model runs only as deep as the hook."""
    device = next(model.parameters()).device
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=device)
    n_pos = 0
    depth = layer + 1
    for start in range(0, len(contexts), EVAL_BATCH):
        toks = contexts[start : start + EVAL_BATCH].to(device)
        with counter.part("dead_fraction"):
            _, cache = model.run_with_cache(toks, names_filter=hook, stop_at_layer=depth)
            counter.forward(len(toks), depth / model.cfg.n_layers)
        keep = torch.ones_like(toks, dtype=torch.bool) if keep_bos else toks != bos_token_id
        x = cache[hook][keep].float()
        fired |= (sae.encode(x.to(sae.dtype)) != 0).any(0)
        n_pos += x.shape[0]
    return fired.cpu(), n_pos


def evaluate(
    model, sae, d: Dictionary, contexts: torch.Tensor, exclude_bos: bool, bos_token_id: int
) -> dict[str, Any]:
    """The metrics train_sae measures (sae.metrics.evaluate_dictionary: l0,
    explained_variance, the spliced CE losses; a transcoder replacing its MLP), and
    dead_fraction from the evaluation tokens, with the passes counted."""
    from circuitflow.devices import precise_math
    from circuitflow.perf import PassCounter
    from circuitflow.sae.metrics import evaluate_dictionary

    counter = PassCounter()
    quality = evaluate_dictionary(
        model, sae, d.layer, contexts, exclude_bos=exclude_bos, bos_token_id=bos_token_id,
        batch_size=EVAL_BATCH, counter=counter,
    )  # fmt: skip
    with precise_math():
        fired, n_pos = firing(model, sae, contexts, sae.cfg.metadata.hook_name, d.layer,
                              not exclude_bos, bos_token_id, counter)  # fmt: skip
    return {
        **quality,
        "dead_fraction": (~fired).float().mean().item(),
        "eval_contexts": len(contexts),
        "eval_tokens": n_pos,
        **counter.summary(len(contexts), unit="evaluation context"),
    }


def run(
    config: dict,
    site: str,
    layer: int,
    model_json: Path | str,
    tokens_npy: Path | str,
    tokens_json: Path | str,
    out_dir: Path | str,
) -> dict[str, Any]:
    """One dictionary's job (run_group with one member): the metrics.json it writes."""
    results = run_group(config, [(site, layer)], model_json, tokens_npy, tokens_json, [out_dir])
    return next(iter(results.values()))


def run_group(
    config: dict,
    members: list[tuple[str, int]],
    model_json: Path | str,
    tokens_npy: Path | str,
    tokens_json: Path | str,
    outs: list[Path | str],
) -> dict[str, dict[str, Any]]:
    """Rule pretrained_sae: the dictionary of each member (site, layer) checked, adapted,
    written to its directory of `outs` (in order) in SAELens's format and evaluated there, one
    after another with the model loaded once; returns each member's metrics.json by its hook.
    Local dictionaries are all checked before the model loads; a release's each as it loads
    (prefetch_saes checked them all against the model). `config` holds device, model, sites,
    layers, capture.exclude_bos and sae (source, kind, pretrained, transcoders,
    eval_contexts)."""
    from circuitflow.capture.tokens import last_contexts, read_token_set
    from circuitflow.devices import resolve_device
    from circuitflow.model.load import load_for_analysis
    from circuitflow.sae.metrics import as_hooked_sae_transformer

    if len(members) != len(outs):
        raise InputError(f"{len(members)} members but {len(outs)} output directories")
    t0 = time.perf_counter()
    cfg = SAETrainConfig.from_dict(config["sae"], device=config["device"])
    ds = [dictionary_for(config, s, n) for s, n in members]
    info = _model_info(model_json)
    run_model = run_model_of(config, info)
    tokens, meta = read_token_set(tokens_npy, tokens_json)
    if meta.get("model_hash") != info["weights_sha256"]:
        raise InputError(
            f"{tokens_json}: a token set for another model (its model_hash is not {model_json}'s "
            "weights_sha256); rerun capture_tokens"
        )
    for d in ds:  # refused in a second, before the model loads
        if d.path is not None:
            kind = dictionary_kind(config, d.site)
            problems = differences(view_of(d), d.site, d.layer, run_model, kind=kind)
            if problems:
                raise InputError(f"{d.key}: {d.label}: {'; '.join(problems)}")
            check_finite(d)
    device = resolve_device(cfg.device)
    contexts = last_contexts(tokens, cfg.eval_contexts)
    model = None  # loaded once, after the first dictionary's checks
    results = {}
    for d, out_dir in zip(ds, outs, strict=True):
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        loaded = load(d, config["model"]["hf_cache"], device)
        check_loaded(d, loaded, run_model, dictionary_kind(config, d.site))
        if d.path is None:  # a release (local ones were checked above)
            check_finite(d, loaded)
        if model is None:
            # The HookedSAETransformer every evaluation splices into, made once (the loaded
            # model is let go: the evaluation would otherwise copy it for each dictionary).
            model = as_hooked_sae_transformer(load_for_analysis(Path(model_json).parent, device))
        results[d.hook] = _evaluate_member(config, d, loaded, model, contexts, meta, device,
                                           out_dir, t0)  # fmt: skip
        del loaded  # one dictionary in memory at a time
        t0 = time.perf_counter()  # the next member's share of the job's time starts here
    return results


def _evaluate_member(config, d, loaded, model, contexts, meta, device, out_dir, t0):
    """One member: adapted, written to `out_dir` and evaluated from there (sae.lifecycle's
    writer); its metrics.json (wall_time_s from `t0`: the first member's includes loading the
    model)."""
    from circuitflow import memory
    from circuitflow.sae.lifecycle import dictionary_kind as saved_kind
    from circuitflow.sae.lifecycle import write_dictionary

    norm_folded = False
    if dictionary_kind(config, d.site) == "transcoder":
        try:
            norm_folded = adapt_transcoder(loaded.sae, loaded.view, d.layer, model)
        except ValueError as err:
            raise InputError(f"{d.key}: {d.label}: {err}") from None
    centre, unknown = model_kwargs_effect(loaded.view, model.cfg.normalization_type)
    if unknown:
        log.warning(
            "%s was trained on a model loaded with %s, which the pipeline does not apply; its "
            "metrics show what that costs", d.label, ", ".join(unknown),
        )  # fmt: skip
    if centre:
        try:
            fold_centering(loaded.sae)
        except ValueError as err:
            raise InputError(f"{d.key}: {d.label}: {err}") from None
    exclude_bos = bool(config["capture"]["exclude_bos"])

    def measure(saved) -> dict[str, Any]:
        quality = evaluate(model, saved, d, contexts, exclude_bos, int(meta["bos_token_id"]))
        return {
            **quality,
            "trained": False,
            "tokens_trained": 0,
            "kind": saved_kind(saved),
            **describe(d, loaded),
            # What it reads as written (a published transcoder's hooks are the pipeline's).
            "hook_name": saved.cfg.metadata.hook_name,
            "centering_folded": centre,
            "norm_folded": norm_folded,
            "d_sae": saved.cfg.d_sae,
            "device": device,
            "wall_time_s": time.perf_counter() - t0,
            "peak_memory_mb": memory.peak_memory_bytes(device) / memory.MiB,
            "resumed": False,
        }

    # Evaluated as attribution and interventions will load it, from the written directory.
    return write_dictionary(out_dir, "pretrained", loaded.sae.save_model, device, measure)
