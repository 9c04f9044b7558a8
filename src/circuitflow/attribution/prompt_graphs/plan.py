"""The prompt_graphs job's plan (circuitflow.resources' rule table): host memory and counted
work, from the config alone.

A graph's size is bounded before any prompt is seen: its features are at most the active ones
(TopK and BatchTopK: `sae.k` per layer and position; JumpReLU and ReLU transcoders are planned at
twice `sae.target_l0`) and at most `attribution.max_feature_nodes`; its nodes add an error node
per layer and position, a token per position and the logit. Rows are computed
`prompt_graph_batch_size` at a time, each a forward and a backward of that many prompt copies.
"""

from __future__ import annotations

import torch

from circuitflow.attribution.plan import estimate_attribution
from circuitflow.memory import load_bytes, n_hooks, n_prompts, prompt_length
from circuitflow.model import architectures
from circuitflow.perf import Work, attribution_forward_flops_per_prompt
from circuitflow.sae.plan import sae_param_bytes, sae_width

# Bytes per adjacency entry at the pruning's peak: the float32 matrix, its pruned copy, their
# row-normalised |.| (float32 and the float64 copy influence iterates with), the edge scores and
# two boolean masks.
ADJACENCY_BYTES = 4 + 4 + 4 + 8 + 4 + 2


def max_features(config: dict, n_layers: int, positions: int) -> int:
    """The most feature nodes a graph can hold."""
    sae = config["sae"]
    per_site = sae["k"] if sae["architecture"] in ("topk", "batchtopk") else 2 * sae["target_l0"]
    active = per_site * len(config["layers"]) * positions
    return min(active, config["attribution"]["max_feature_nodes"])


def max_nodes(config: dict, model_cfg, positions: int) -> int:
    n_f = max_features(config, model_cfg.n_layers, positions)
    return n_f + (model_cfg.n_layers + 1) * positions + 1


def job_bytes(config: dict, rule: str, device: str) -> int:
    """The fp32 model and transcoders, a batch of rows' forward and backward (the attribution
    stage's per-prompt gradient pass, without spliced SAEs), and the dense adjacency."""
    cfg = architectures.model_cfg(config)
    n_params = architectures.n_params(cfg)
    positions = prompt_length(config, cfg)
    d_sae = sae_width(config, cfg.d_model)
    est = estimate_attribution(cfg, n_params, positions, 0, d_sae, torch.float32, device, "atp")
    rows = est.per_context_device * config["attribution"]["prompt_graph_batch_size"]
    weights = n_params * 4 + n_hooks(config) * sae_param_bytes(cfg.d_model, d_sae)
    adjacency = max_nodes(config, cfg, positions) ** 2 * ADJACENCY_BYTES
    work = weights + est.fixed_device + rows + adjacency
    real = config["model"]["name"] != "embedded"
    return max(load_bytes(n_params) if real else 0, work)


def graph_passes(config: dict, model_cfg, positions: int) -> int:
    """Forward equivalents of one graph at most: the clean pass, the bias pass, and a forward
    and a backward (2) per row: every feature kept and the logit."""
    return 2 + 3 * (max_features(config, model_cfg.n_layers, positions) + 1)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work:
    """The behaviour's graphs times graph_passes, of fp32 forward passes."""
    cfg = architectures.model_cfg(config)
    positions = prompt_length(config, cfg)
    graphs = n_prompts(config, behaviour, config["attribution"]["prompt_graphs"] or None)
    if not config["attribution"]["prompt_graphs"]:
        graphs = 0
    per_pass = attribution_forward_flops_per_prompt(cfg, positions, 0, 0)
    return Work({"float32": graphs * graph_passes(config, cfg, positions) * per_pass})
