"""The prompt_graphs job's plan (circuitflow.resources' rule table): host memory and counted
work, from the config alone.

A graph's size is bounded before any prompt is seen: its features are at most the active ones
(per transcoder and position, the description's `active`: a TopK or BatchTopK transcoder's k,
a published one's as its config states it, else twice the L0 its release lists; JumpReLU and
ReLU transcoders are planned at twice `sae.target_l0`) and at most
`attribution.max_feature_nodes`; its nodes add an error node per layer and position, a token
per position and the logit. Rows are computed
`prompt_graph_batch_size` at a time, each a forward and a backward of that many prompt copies.
"""

from __future__ import annotations

from circuitflow.attribution.plan import estimate_attribution
from circuitflow.description import describe
from circuitflow.memory import load_bytes
from circuitflow.model.flops import attribution_forward_flops_per_prompt
from circuitflow.perf import Work
from circuitflow.sae.plan import sae_param_bytes

# A row's forward and backward through the frozen model, per prompt copy: the logits and their
# gradient (fp32, [P, vocab] each), and per layer about this many d_model-wide fp32 tensors a
# position saved for the backward (norm inputs, values, z, the residual adds; no MLP, whose
# output is a leaf, no pattern, which is the clean run's). Measured by
# benchmarks/prompt_graphs.py (GPT-2 small, 32 positions: ~20 MB a copy).
ROW_RESID = 8
# Bytes per adjacency entry at the pruning's peak: the float32 matrix, its pruned copy, their
# row-normalised |.| (float32 and the float64 copy influence iterates with), the edge scores and
# two boolean masks.
ADJACENCY_BYTES = 4 + 4 + 4 + 8 + 4 + 2


def active_features(config: dict, positions: int) -> int:
    """The most features a prompt can have active: every transcoder's (the run's description:
    its k, a published one's from its config or twice its release's L0) at every position."""
    return sum(d.active for d in describe(config).transcoders) * positions


def max_features(config: dict, positions: int) -> int:
    """The most feature nodes a graph can hold."""
    return min(active_features(config, positions), config["attribution"]["max_feature_nodes"])


def max_nodes(config: dict, model_cfg, positions: int) -> int:
    n_f = max_features(config, positions)
    return n_f + (model_cfg.n_layers + 1) * positions + 1


def graph_bytes(config: dict, device: str) -> dict[str, int]:
    """A graph's memory by part: the fp32 model and transcoders (`weights`), a batch of rows'
    forward and backward (`rows`: ROW_RESID, times prompt_graph_batch_size; the attribution
    stage's `fixed` weight copies of its backward), the rows
    computed before the graph is assembled (`store`) and the dense adjacency at its largest
    (`adjacency`)."""
    run = describe(config)
    cfg, n_params, positions = run.model.cfg, run.model.n_params, run.prompt_length
    d_sae = run.transcoder_width
    est = estimate_attribution(cfg, n_params, positions, 0, d_sae, "float32", device, "atp")
    per_copy = 4 * positions * (2 * cfg.d_vocab + ROW_RESID * cfg.n_layers * cfg.d_model)
    columns = active_features(config, positions) + (cfg.n_layers + 1) * positions + 1
    transcoders = sum(sae_param_bytes(cfg.d_model, d.width) for d in run.transcoders)
    return {
        "weights": n_params * 4 + transcoders,
        "fixed": est.fixed_device,
        "rows": per_copy * config["attribution"]["prompt_graph_batch_size"],
        # The rows computed, over every active feature's column, and their folded copy.
        "store": 2 * (max_features(config, positions) + 1) * columns * 4,
        "adjacency": max_nodes(config, cfg, positions) ** 2 * ADJACENCY_BYTES,
    }


def job_bytes(config: dict, rule: str, device: str) -> int:
    """graph_bytes in all; a real model's load where that is more."""
    run = describe(config)
    work = sum(graph_bytes(config, device).values())
    return max(0 if run.model.embedded else load_bytes(run.model.n_params), work)


def graph_passes(config: dict, model_cfg, positions: int) -> int:
    """Forward equivalents of one graph at most: the clean pass, the bias pass, a forward and
    a backward (2) per row (every feature kept and the logit; the head split's rows), and the
    validation's forward of its ablations (twice, the second with the norms frozen)."""
    attr = config["attribution"]
    rows = max_features(config, positions) + 1
    head_rows = attr["prompt_graph_edge_heads"] * min(attr["prompt_graph_split_targets"], rows)
    validation = 3 + 2 * attr["prompt_graph_validation_features"]
    return 2 + 3 * (rows + head_rows) + validation


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work:
    """The behaviour's graphs times graph_passes, of fp32 forward passes."""
    run = describe(config)
    cfg, positions = run.model.cfg, run.prompt_length
    graphs = run.n_prompts(behaviour, config["attribution"]["prompt_graphs"] or None)
    if not config["attribution"]["prompt_graphs"]:
        graphs = 0
    per_pass = attribution_forward_flops_per_prompt(cfg, positions, 0, 0)
    return Work({"float32": graphs * graph_passes(config, cfg, positions) * per_pass})
