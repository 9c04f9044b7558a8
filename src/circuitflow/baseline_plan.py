"""The baseline stage's job plan (rule baseline) for circuitflow.resources (the rule table): its
host memory (`job_bytes`) and counted work (`job_work`). Apart from baseline.py, which imports
torch and pandas: every Snakemake invocation plans each job."""

from __future__ import annotations

from circuitflow.memory import model_dtype_name, n_prompts, prompt_length
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.model.plan import model_bytes
from circuitflow.perf import Work


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of a baseline job's work: the model (model.plan.model_bytes)."""
    return model_bytes(config, device)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work:
    """Two forward passes a prompt (clean, corrupted) of the behaviour's prompts."""
    cfg = architectures.model_cfg(config)
    plen = prompt_length(config, cfg)
    dtype = model_dtype_name(config, "cuda")
    return Work(
        {dtype: 2 * n_prompts(config, behaviour) * plen * forward_flops_per_token(cfg, plen)}
    )
