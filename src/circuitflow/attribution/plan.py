"""The attribution stage's memory estimate and job plan (rule attribution): its peak per prompt
(`estimate_attribution`, which the stage plans its batch by), and the job's host memory and
counted work for circuitflow.resources (the rule table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from circuitflow.attribution import methods
from circuitflow.description import Run, describe
from circuitflow.memory import Estimate, dtype_bytes, load_bytes, model_dtype_name
from circuitflow.memory.planning import mlp_copies, model_dims
from circuitflow.model.flops import attribution_forward_flops_per_prompt
from circuitflow.perf import Work
from circuitflow.sae.plan import sae_param_bytes

if TYPE_CHECKING:
    import torch


def passes(
    model_cfg, n_saes: int, acfg, n_prompts: int, d_sae: int | None = None
) -> dict[str, float]:
    """Forward-pass equivalents per prompt of each part of the attribution stage (the parts its
    PassCounter names), for `n_prompts` prompts and config `acfg` (AttributionConfig), read off
    the loops of attribution/scores.py and attribution/graph.py and the method's registry record
    (attribution/methods: its `passes`). A backward with frozen weights computes input
    gradients only: it counts two forwards. Exact patching, edges and their validation run on
    the validation prompts only, reusing the score pass's clean metric and gradients there
    (scores.Kept); they are upper bounds where the work depends on the scores (features that
    never move, nodes without upstream nodes).
    """
    method = acfg.method_record
    layers, heads = model_cfg.n_layers, model_cfg.n_heads
    # The corrupted forward both share, then the method's own passes (its registry record).
    parts = {method.name: 1.0 + method.passes(acfg)}
    share = min(acfg.validation_prompts, n_prompts) / max(n_prompts, 1)
    features = acfg.validation_features
    if d_sae is not None:
        features = min(features, n_saes * d_sae)
    exact = 1 + layers + n_saes + min(acfg.validation_heads, layers * heads) + features
    parts["exact"] = share * (1.0 + exact)  # a corrupted forward, one per node
    # Clean and corrupted forwards, one cut forward per upstream node (the gradients: kept).
    # Bridges (graph.py): at most an error node and `bridge_features` features per SAE.
    bridges = n_saes * (1 + acfg.bridge_features) if acfg.bridge_features else 0
    upstream = acfg.max_graph_nodes + bridges
    parts["edges"] = share * (2.0 + upstream)
    if acfg.validation_edges:
        # Clean and corrupted forwards, one cut forward per upstream node, one per edge.
        parts["edge_validation"] = share * (2.0 + 2.0 * acfg.validation_edges)
    return parts


# Attribution: a forward with gradients on through every layer with the SAEs spliced, then the
# backward. Per token and layer, TransformerLens saves for the backward the LayerNorm (RMSNorm)
# chains of its four norm calls, q/k/v/z and the residual adds' operands (ATTRIBUTION_RESID, in
# d_model-wide tensors), the MLP activation's inputs (mlp_copies) and 2.5 [heads, t, t] tensors
# (softmax output and the cleaned pattern); the attribution keeps the corrupted and clean
# activations and their gradients. Per token overall: the embedding's chain, the final norm and
# ATTRIBUTION_LOGITS copies of the logits (and their gradient); per spliced SAE 3.3 d_sae-wide
# fp32 tensors (features, their gradient, the corrupted features). Fixed: the weight copies the
# backward keeps (W_O and, in gated MLPs, W_gate, W_in and W_out per layer; W_U). Counted on CPU
# at fp32 by tests/test_memory_accuracy.py.
ATTRIBUTION_RESID = {"LN": 12.8, "RMS": 10.1}
ATTRIBUTION_TOKEN_RESID = {"LN": 12.2, "RMS": 8.5}
ATTRIBUTION_SCORES = 2.5
ATTRIBUTION_LOGITS = 2
ATTRIBUTION_SAE = 3.3
ATTRIBUTION_WO_COPIES = 2.3  # W_O's copy and the projections' saved layouts (LN models)


def kept_bytes(model_cfg, prompt_length: int, n_saes: int, d_sae: int, compute_dtype) -> int:
    """Host bytes of one validation prompt's kept gradients (scores.Kept): dm/da of every node
    tensor, the embedding, each layer's hook_z and MLP output in the model's dtype, each SAE's
    features and error in fp32."""
    d, h, dh, _kv, _m, _v = model_dims(model_cfg)
    plain = (d + model_cfg.n_layers * (h * dh + d)) * dtype_bytes(compute_dtype)
    return prompt_length * (plain + n_saes * (d_sae + d) * 4)


def estimate_attribution(
    model_cfg,
    n_params: int,
    prompt_length: int,
    n_saes: int,
    d_sae: int,
    compute_dtype: torch.dtype | str,
    device: str,
    method: str = "ig",
    kept_prompts: int = 0,
) -> Estimate:
    """Peak memory of the attribution stage per prompt: the gradient pass counted below, times
    the method's `memory_factor` (its registry record, attribution/methods: 1.0 for atp, and
    for ig, which runs its steps one after another, each such a pass); on the host, the
    gradients kept for `kept_prompts` validation prompts (kept_bytes)."""
    c = dtype_bytes(compute_dtype)
    t = prompt_length
    d, h, dh, _kv, m, v = model_dims(model_cfg)
    norm_type = str(getattr(model_cfg, "normalization_type", None) or "")
    norm = "RMS" if norm_type.startswith("RMS") else "LN"
    layer = (
        ATTRIBUTION_RESID[norm] * d
        + mlp_copies(model_cfg, grad=True) * m
        + ATTRIBUTION_SCORES * h * t
    )
    per_token = model_cfg.n_layers * layer + ATTRIBUTION_TOKEN_RESID[norm] * d
    per_prompt = t * per_token * c + ATTRIBUTION_LOGITS * t * v * c
    per_prompt += int(ATTRIBUTION_SAE * n_saes * t * d_sae * 4)  # SAEs run in fp32
    gated = getattr(model_cfg, "gated_mlp", False)
    copies = ATTRIBUTION_WO_COPIES * h * dh * d if norm == "LN" else h * dh * d
    copies += 3 * d * m if gated else 0
    fixed = int(model_cfg.n_layers * copies * c + d * v * c)
    return Estimate(
        weights=n_params * c + n_saes * sae_param_bytes(d, d_sae),
        per_context_device=int(per_prompt * methods.get(method).memory_factor),
        per_context_host=0,
        buffers=kept_prompts * kept_bytes(model_cfg, t, n_saes, d_sae, compute_dtype),
        device=device,
        fixed_device=fixed,
        item="prompt",
    )


# A row of a features stage's contexts.parquet as the job holds it (its window's tokens and
# activations, pandas' object columns): for the graph features' top contexts each spliced
# dictionary's table is read in turn (attribution.contexts.top_contexts), the wanted rows kept.
CONTEXT_ROW_BYTES = 1024


def contexts_bytes(config: dict, run: Run) -> int:
    """One contexts table, the widest spliced dictionary's: every feature's kept contexts (top
    and quantile-sampled, features.plan.kept_rows)."""
    from circuitflow.features.plan import kept_rows

    f = config["features"]
    return kept_rows(run.spliced_width, f["k"], f["samples"]) * CONTEXT_ROW_BYTES


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of an attribution job's work at `attribution.batch_size`, the kept gradients
    of the largest behaviour's validation prompts included, and the features stage's contexts
    tables it reads (contexts_bytes); a real model's load where that is more. Every spliced SAE
    is planned at the widest one's width (the run's description)."""
    run = describe(config)
    n_params = run.model.n_params
    attr = config["attribution"]
    d_sae = run.spliced_width
    kept = min(attr["validation_prompts"], run.n_prompts(None, attr.get("max_prompts")))
    est = estimate_attribution(
        run.model.cfg, n_params, run.prompt_length, len(run.spliced), d_sae,
        model_dtype_name(config, device), device, attr["method"], kept,
    )  # fmt: skip
    work = est.host_peak(int(attr["batch_size"])) + contexts_bytes(config, run)
    return max(0 if run.model.embedded else load_bytes(n_params), work)


def prompt_work(run: Run, acfg, n_prompts: int, prompt_length: int | None = None):
    """(forward-pass equivalents a prompt by part, FLOPs of one such pass) of attribution over
    `n_prompts` prompts of `prompt_length` tokens (the run's planned length when None), every
    spliced SAE at the widest one's width: what the job's walltime and the report's GPU-hours
    both charge."""
    hooks, d_sae = len(run.spliced), run.spliced_width
    t = run.prompt_length if prompt_length is None else prompt_length
    parts = passes(run.model.cfg, hooks, acfg, n_prompts, d_sae)
    return parts, attribution_forward_flops_per_prompt(run.model.cfg, t, hooks, d_sae)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work:
    """The behaviour's prompts times the passes `passes` counts (the method, exact patching,
    edges and their validation) of a forward with every SAE spliced (prompt_work). The feature
    contexts cost nothing here: the features stage found them."""
    from circuitflow.attribution.config import AttributionConfig

    run = describe(config)
    acfg = AttributionConfig.from_dict(config["attribution"])
    n = run.n_prompts(behaviour, acfg.max_prompts)
    parts, per_pass = prompt_work(run, acfg, n)
    dtype = model_dtype_name(config, "cuda")
    return Work({dtype: n * sum(parts.values()) * per_pass})
