"""The attribution stage's memory estimate and job plan (rule attribution): its peak per prompt
(`estimate_attribution`, which the stage plans its batch by), and the job's host memory and
counted work for circuitflow.resources (the rule table)."""

from __future__ import annotations

import torch

from circuitflow.attribution import methods
from circuitflow.memory import (
    Estimate,
    dtype_bytes,
    load_bytes,
    model_dtype,
    n_hooks,
    n_prompts,
    prompt_length,
)
from circuitflow.memory.planning import mlp_copies, model_dims
from circuitflow.model import architectures
from circuitflow.model.flops import attribution_forward_flops_per_prompt
from circuitflow.perf import Work, attribution_passes
from circuitflow.sae.plan import sae_param_bytes, sae_width

# The feature contexts encode the activation file this many rows at a time.
CONTEXT_CHUNK_ROWS = 16384


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
    compute_dtype: torch.dtype,
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


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of an attribution job's work at `attribution.batch_size`, the kept gradients
    of the largest behaviour's validation prompts included; on CPU at least the feature
    contexts' chunk (three d_sae-wide fp32 tensors a row); a real model's load where that is
    more."""
    cfg = architectures.model_cfg(config)
    n_params = architectures.n_params(cfg)
    attr = config["attribution"]
    d_sae = sae_width(config, cfg.d_model)
    kept = min(attr["validation_prompts"], n_prompts(config, None, attr.get("max_prompts")))
    est = estimate_attribution(
        cfg, n_params, prompt_length(config, cfg), n_hooks(config), d_sae,
        model_dtype(config, device), device, attr["method"], kept,
    )  # fmt: skip
    work = est.host_peak(int(attr["batch_size"]))
    if not device.startswith("cuda"):
        work = max(work, est.weights + CONTEXT_CHUNK_ROWS * d_sae * 4 * 3)
    real = config["model"]["name"] != "embedded"
    return max(load_bytes(n_params) if real else 0, work)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work:
    """The behaviour's prompts times the passes perf.attribution_passes counts (the method, exact
    patching, edges and their validation) of a forward with every SAE spliced, and the feature
    contexts' encoding."""
    from circuitflow.attribution.config import AttributionConfig

    cfg = architectures.model_cfg(config)
    acfg = AttributionConfig.from_dict(config["attribution"])
    hooks, d_sae = n_hooks(config), sae_width(config, cfg.d_model)
    n = n_prompts(config, behaviour, acfg.max_prompts)
    passes = sum(attribution_passes(cfg, hooks, acfg, n, d_sae).values())
    per_pass = attribution_forward_flops_per_prompt(cfg, prompt_length(config, cfg), hooks, d_sae)
    contexts = acfg.context_max_tokens * hooks * 2 * cfg.d_model * d_sae
    dtype = str(model_dtype(config, "cuda")).removeprefix("torch.")
    return Work({dtype: n * passes * per_pass + contexts})
