"""Per-rule job resources (GPUs, CPUs, host memory, walltime) planned from the config.

Rules call these through the helpers at the end of workflow/rules/common.smk; a Slurm profile
(profiles/csd3) turns them into sbatch options. Host memory is the memory planner's peak of
the job (memory.job_peak_bytes: the libraries the job imports plus its work); walltimes are
deliberately simple estimates. Memory and walltime grow linearly with Snakemake's `attempt`
(1, 2, ...), so a job killed for memory or walltime gets more on its retry, and walltime is
capped at the cluster's limit. The model's shape comes from `model.architectures` (the
embedded model's config, a local directory's config.json, the known real architectures), else
from `model.n_layers` with a GPT-2-medium-like width. Walltimes wrong by a factor of two are
fine; wrong by ten is a bug: override a rule with `--set-resources RULE:mem_mb=...` meanwhile.
"""

from __future__ import annotations

import math

from circuitflow.model import architectures

# Rules that run the model or train on activations: one GPU each unless `device: cpu`.
GPU_RULES = frozenset(
    {"baseline", "capture", "capture_shard", "train_sae", "attribution", "interventions"}
)
# Base walltime in minutes on attempt 1, before model-size scaling.
BASE_RUNTIME = {
    "train_model": 30,
    "prompts": 10,
    "baseline": 20,
    "provenance": 10,
    "capture_tokens": 20,
    "capture": 30,
    "capture_shard": 30,
    "merge_capture": 20,
    "train_sae": 30,
    "attribution": 60,
    "interventions": 60,
}
DEFAULT_RUNTIME = 30
# Rules that only read small files and write tables and figures: one core, 2 GB, 15 minutes.
LIGHT_RULES = frozenset(
    {
        "sae_summary",
        "report_baseline",
        "report_behaviour",
        "report_provenance",
        "report_gpu_hours",
        "job_costs",
        "interventions_across",
        "provenance_run",
    }
)
LIGHT_RUNTIME = 15
# Slurm's memory limit over the job's plan (memory.job_peak_bytes, within 25% of measured
# peaks): a plan that fell 25% short still fits.
MEM_HEADROOM = 1.25
# CSD3 ampere: at most 32 CPUs per GPU (a node has 4 A100s and 128 cores).
MAX_CPUS_PER_GPU = 32
MB = 2**20
# Walltimes scale with n_params / GPT2_PARAMS (GPT-2 small's nominal size; as loaded, with its
# unembedding untied, it counts 163M, so its jobs get 1.3x the base).
GPT2_PARAMS = 124_000_000


def gpus(config: dict, rule: str) -> int:
    """GPUs for one job: 1 for model and SAE work unless the config pins `device: cpu`."""
    return int(rule in GPU_RULES and config.get("device") != "cpu")


def threads(config: dict, rule: str) -> int:
    """CPUs for one job. The embedded model's jobs take one core each and run side by side: its
    matrices are too small for a second thread to pay much (1.4x for train_model), OpenMP
    threads that find their core busy spin (slowing a job ~10x), and a thread count that
    followed the machine's cores would change the trained weights (reductions split
    differently: 2e-4 after 30 steps), so a laptop and a cluster would disagree. Real models use
    8 per GPU (data loading, HDF5, tokenisation), well within CSD3's 32 per GPU."""
    small = config["model"]["name"] == "embedded"
    if small or rule in LIGHT_RULES:
        return 1
    n = 8 if gpus(config, rule) else 4
    return min(n, MAX_CPUS_PER_GPU * max(1, gpus(config, rule)))


def mem_mb(config: dict, rule: str, attempt: int = 1) -> int:
    """Host memory (MB) for one job on its `attempt`-th try: the memory planner's peak of the
    job (memory.job_peak_bytes: the process's libraries plus its work, on a GPU where the rule
    gets one) with MEM_HEADROOM, times the attempt."""
    from circuitflow import memory

    device = "cuda" if gpus(config, rule) else "cpu"
    return math.ceil(memory.job_peak_bytes(config, rule, device) * MEM_HEADROOM / MB) * attempt


def runtime(config: dict, rule: str, attempt: int = 1, cap: int | None = None) -> int:
    """Walltime (minutes) for the `attempt`-th try, at most `cap` (the cluster's limit)."""
    if rule in LIGHT_RULES:
        return min(LIGHT_RUNTIME * attempt, cap) if cap else LIGHT_RUNTIME * attempt
    minutes = BASE_RUNTIME.get(rule, DEFAULT_RUNTIME)
    size = max(1.0, architectures.model_shape(config).n_params / GPT2_PARAMS)
    if rule in GPU_RULES or rule == "capture_tokens":
        minutes *= size
    if rule == "train_sae":
        # ~10 minutes per million tokens for a GPT-2-sized SAE (pending the GPU benchmarks).
        sae = config.get("sae", {})
        minutes += 10 * sae.get("total_tokens", 1_000_000) / 1e6 * size
    minutes = int(minutes * attempt)
    return min(minutes, cap) if cap else minutes
