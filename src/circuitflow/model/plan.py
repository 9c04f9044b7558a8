"""The model stage's job plans (rules train_model, prefetch_model), and the host memory of any
job that holds only the model (baseline): for circuitflow.resources, the rule table."""

from __future__ import annotations

from circuitflow.memory import dtype_bytes, load_bytes, model_dtype_name
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.perf import Work


def model_bytes(config: dict, device: str) -> int:
    """Host bytes of the configured model's weights in its dtype on `device`, or of a real
    model's load (its fp32 conversion copies) where that is more."""
    cfg = architectures.model_cfg(config)
    n_params = architectures.n_params(cfg)
    weights = n_params * dtype_bytes(model_dtype_name(config, device))
    real = config["model"]["name"] != "embedded"
    return max(load_bytes(n_params) if real else 0, weights)


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of a train_model or prefetch_model job's work: the model."""
    return model_bytes(config, device)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work | None:
    """train_model: the embedded model's training steps (forward and backward, 3 forwards);
    prefetch_model downloads (a localrule, no walltime)."""
    if rule != "train_model":
        return None
    cfg = architectures.model_cfg(config)
    training = config["embedded"]["training"]
    tokens = training["steps"] * training["batch_size"] * cfg.n_ctx
    return Work({"float32": 3 * tokens * forward_flops_per_token(cfg, cfg.n_ctx)})
