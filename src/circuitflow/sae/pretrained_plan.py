"""The job plans of published dictionaries (rules prefetch_saes and pretrained_sae): host memory
and counted work for circuitflow.resources (the rule table).

A published dictionary's width is its own, not the config's: it is read from its cfg.json (a
local directory, or a release's once prefetch_saes has put it in the Hugging Face cache; jobs
are planned when they are scheduled, after the prefetch), else taken as the config's
`sae.expansion_factor` x d_model."""

from __future__ import annotations

import torch

from circuitflow.capture.plan import context_length
from circuitflow.memory import estimate_forward, load_bytes
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.perf import Work
from circuitflow.sae.plan import sae_param_bytes, sae_width

EVAL_BATCH = 16  # contexts a pass of the evaluation takes (pretrained_stage.EVAL_BATCH)
ENCODES = 3  # the SAE runs on the statistics' rows, in the spliced pass and in the firing pass


def dictionary_width(config: dict, d_model: int) -> int:
    """The widest configured dictionary's d_sae where its cfg.json can be read, else the
    config's width (sae.plan.sae_width)."""
    from circuitflow.errors import ConfigError, InputError
    from circuitflow.sae import pretrained

    widths = []
    try:
        for d in pretrained.dictionaries(config):
            if d.path is not None:
                view = pretrained.read_local(d.path)
            else:
                rel = pretrained.resolve_release(d.release, d.sae_id)
                view = pretrained.release_view(rel, config["model"]["hf_cache"]) or {}
            if isinstance(view.get("d_sae"), int):
                widths.append(view["d_sae"])
    except (ConfigError, InputError, KeyError, TypeError):
        pass  # not readable here: the job refuses it in one line
    return max(widths) if widths else sae_width(config, d_model)


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of the work. prefetch_saes: one dictionary loaded at a time (its parameters
    and the copy they are read into). pretrained_sae: the model in float32 twice (the one
    loaded and the HookedSAETransformer copy the evaluation splices into), the dictionary, a
    batch of the evaluation (a forward pass to the logits, the features of its rows), or a real
    model's load where that is more."""
    cfg = architectures.model_cfg(config)
    d_sae = dictionary_width(config, cfg.d_model)
    sae_bytes = sae_param_bytes(cfg.d_model, d_sae)
    if rule == "prefetch_saes":
        return 2 * sae_bytes
    n_params = architectures.n_params(cfg)
    t = context_length(config, cfg)
    features = t * d_sae * 4 * 2  # a row's features and their non-zero mask, per context
    est = estimate_forward(
        cfg, n_params, t, None, 1, torch.float32, "float32", device,
        buffers=n_params * 4 + sae_bytes,
    )  # fmt: skip
    host = est.host_peak(EVAL_BATCH)
    if not device.startswith("cuda"):
        host += EVAL_BATCH * features
    real = config["model"]["name"] != "embedded"
    return max(load_bytes(n_params) if real else 0, host)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work | None:
    """pretrained_sae: `sae.eval_contexts` contexts through the model three times (clean,
    spliced, ablated) and once as deep as the deepest configured layer (which latents fire),
    and the dictionary's encoder and decoder on every position of each. prefetch_saes: none
    counted (its time is the download)."""
    if rule != "pretrained_sae":
        return None
    cfg = architectures.model_cfg(config)
    t = context_length(config, cfg)
    n = config["sae"]["eval_contexts"]
    depth = max(config["layers"]) + 1
    passes = 3 * forward_flops_per_token(cfg, t) + forward_flops_per_token(
        cfg, t, depth, unembed=False
    )
    d_sae = dictionary_width(config, cfg.d_model)
    sae = ENCODES * 4.0 * cfg.d_model * d_sae
    return Work({"float32": n * t * (passes + sae)})
