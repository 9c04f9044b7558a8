"""Per-rule job resources (GPUs, CPUs, host memory, walltime) planned from the config.

Rules call these through the helpers at the end of workflow/rules/common.smk; a Slurm profile
(profiles/csd3) turns them into sbatch options. Host memory is the memory planner's peak of
the job (memory.job_peak_bytes: the libraries the job imports plus its work). Walltime comes
from the job's counted work (`job_work`: the FLOPs of its passes as perf counts them, the bytes
it moves through the disk) at a stated, conservative share of the device's peak (`Cluster`,
set by the profile), plus start-up. Memory and walltime grow linearly with Snakemake's `attempt`
(1, 2, ...), so a job killed for memory or walltime gets more on its retry; walltime is capped
at the cluster's limit, and jobs that resume from checkpoints start with a few hours at most.
The model's shape comes from `model.architectures` (the embedded model's config, a local
directory's config.json, the known real architectures), else from `model.n_layers` with a
GPT-2-medium-like width. Override a rule with `--set-resources RULE:runtime=...` if needed.
"""

from __future__ import annotations

import ast
import math
import os
import re
from dataclasses import dataclass, fields

from circuitflow import perf
from circuitflow.model import architectures

# Rules that run the model or train on activations: one GPU each unless `device: cpu`.
GPU_RULES = frozenset(
    {"baseline", "capture", "capture_shard", "train_sae", "attribution", "interventions"}
)
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


def setting_value(raw):
    """A profile's default-resource as a value: environment variables expanded, quotes and
    numbers parsed (`"'A100'"` -> 'A100', `5e7` -> 50000000.0)."""
    if not isinstance(raw, str):
        return raw
    value = os.path.expandvars(raw)
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


ACCOUNT_HINT = (
    "export CSD3_ACCOUNT=PROJECT-SL2 (project and service level; `mybalance` lists your "
    "projects) or edit slurm_account in your profile"
)


def account_problem(key: str, account) -> str | None:
    """Why a profile's Slurm account (`key` = slurm_account or gpu_account) cannot work, in one
    line, or None. The profile adds -CPU or -GPU to $CSD3_ACCOUNT, so an account that ends in
    both (CSD3_ACCOUNT=PROJECT-SL2-GPU, the form `mybalance` prints) would make sbatch refuse
    every job."""
    account = str(account)
    if not account or "$" in account or account.startswith("-"):
        return f"Slurm account not set ({key} = {account!r}): {ACCOUNT_HINT}"
    if re.search(r"-(CPU|GPU)-(CPU|GPU)$", account, re.IGNORECASE):
        base = re.sub(r"-(CPU|GPU)$", "", account, flags=re.IGNORECASE)
        return (
            f"Slurm account {account!r} ({key}) ends in the -CPU/-GPU suffix twice: set "
            f"CSD3_ACCOUNT={re.sub(r'-(CPU|GPU)$', '', base, flags=re.IGNORECASE)} "
            "without it; the profile adds -GPU for GPU jobs and -CPU for the rest"
        )
    return None


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


@dataclass(frozen=True)
class Cluster:
    """What a job's walltime assumes of the machine it runs on: a profile states it among its
    default-resources (common.smk reads them; profiles/README.md lists them), else these
    defaults (an A100 node of CSD3's ampere partition). Whole numbers, since Snakemake keeps
    resources as integers or strings. `gpu_peak_percent` is the conservative part: the share of
    the device's datasheet peak a job is assumed to reach. The GPU suite measured its stages
    at 40-80% of a CPU's measured peak (benchmarks/results/cpu.json); a job that reaches a
    tenth of that still finishes in time."""

    gpu_type: str = "A100"  # a key of perf.NOMINAL_PEAK_FLOPS
    gpu_peak_percent: int = 5
    cpu_core_peak_gflops: int = 50  # fp32 per core, jobs without a GPU (AVX-512 at ~3 GHz: 96)
    disk_mb_per_s: int = 50  # activation files written or read (Lustre under load)
    startup_minutes: int = 10  # imports, loading the model and SAEs, CUDA start
    resumable_max_runtime: int = 240  # minutes: first attempt of a job that resumes
    max_runtime: int | None = None  # minutes: the cluster's limit (every attempt)

    @classmethod
    def from_settings(cls, setting) -> Cluster:
        """From a profile: `setting(name, default)` reads one default-resource."""
        values = {f.name: setting(f.name, None) for f in fields(cls)}
        return cls(**{name: v for name, v in values.items() if v is not None})

    @property
    def peak_share(self) -> float:
        return self.gpu_peak_percent / 100


# Jobs that resume from their checkpoints when Slurm stops them (SIGTERM at the walltime): their
# first attempt is capped at Cluster.resumable_max_runtime and each retry goes on where it stopped.
RESUMABLE_RULES = frozenset({"capture", "capture_shard", "train_sae"})
# Tokenising the corpus (capture_tokens): a fast tokenizer does ~1M tokens/s a core.
TOKENIZE_TOKENS_PER_S = 1e5


@dataclass(frozen=True)
class Work:
    """A job's counted work: matrix-multiply FLOPs in each compute dtype, bytes through the
    disk, and seconds of work that is neither."""

    flops: dict[str, float]
    disk_bytes: float = 0.0
    other_seconds: float = 0.0


def _prompt_length(config: dict, cfg) -> int:
    """Tokens a prompt is planned at: the memory planner's (the embedded model's context; real
    models' IOI and capitals prompts are shorter than memory.PRESET_PROMPT_LENGTH)."""
    from circuitflow.memory import PRESET_PROMPT_LENGTH

    return cfg.n_ctx if config["model"]["name"] == "embedded" else PRESET_PROMPT_LENGTH


def _n_prompts(config: dict, behaviour: str | None, cap: int | None = None) -> int:
    """The behaviour's prompts (the largest behaviour when none is named), at most `cap`."""
    specs = config["behaviours"]
    names = [behaviour] if behaviour in specs else list(specs)
    n = max(specs[name].get("n_prompts", 256) for name in names)
    return min(n, cap) if cap else n


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work | None:
    """The counted work of one job of `rule` (for `behaviour` where the rule runs per
    behaviour), from the config alone; None for rules that count none (light rules)."""
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.interventions.config import InterventionsConfig

    cfg = architectures.model_cfg(config)
    model_dtype = _model_dtype(config)
    capture, sae = config["capture"], config["sae"]
    n_hooks = len(config["layers"]) * len(config["sites"])
    d_sae = sae.get("d_sae") or sae["expansion_factor"] * cfg.d_model
    real = config["model"]["name"] != "embedded"
    t = capture.get("context_length") or (min(cfg.n_ctx, 128) if real else cfg.n_ctx)
    per_context = t - 1 if capture.get("exclude_bos", True) else t
    contexts = math.ceil(capture["n_tokens"] / per_context)
    plen = _prompt_length(config, cfg)
    forward = perf.forward_flops_per_token

    if rule == "train_model":
        training = config["embedded"]["training"]
        tokens = training["steps"] * training["batch_size"] * cfg.n_ctx
        return Work({"float32": 3 * tokens * forward(cfg, cfg.n_ctx)})
    if rule == "capture_tokens":
        return Work({}, other_seconds=contexts * t / TOKENIZE_TOKENS_PER_S)
    if rule in ("capture", "capture_shard"):
        shards = capture.get("shards", 1) if rule == "capture_shard" else 1
        depth = max(config["layers"]) + 1
        flops = contexts * t * forward(cfg, t, depth, unembed=False) / shards
        itemsize = 2 if capture.get("dtype", "float16") == "float16" else 4
        written = contexts * per_context * n_hooks * cfg.d_model * itemsize / shards
        return Work({model_dtype: flops}, disk_bytes=written)
    if rule == "train_sae":
        tokens = sae["total_tokens"]
        itemsize = 2 if capture.get("dtype", "float16") == "float16" else 4
        evaluation = 3 * sae["eval_contexts"] * t * forward(cfg, t)  # clean, spliced, ablated
        return Work(
            {
                "float32": tokens * perf.sae_training_flops_per_token(cfg.d_model, d_sae)
                + evaluation
            },
            disk_bytes=tokens * cfg.d_model * itemsize,
        )
    if rule == "baseline":
        n = _n_prompts(config, behaviour)
        return Work({model_dtype: 2 * n * plen * forward(cfg, plen)})
    if rule == "attribution":
        acfg = AttributionConfig.from_dict(config.get("attribution"))
        n = _n_prompts(config, behaviour, acfg.max_prompts)
        passes = sum(perf.attribution_passes(cfg, n_hooks, acfg, n, d_sae).values())
        per_pass = perf.attribution_forward_flops_per_prompt(cfg, plen, n_hooks, d_sae)
        contexts_flops = acfg.context_max_tokens * n_hooks * 2 * cfg.d_model * d_sae
        return Work({model_dtype: n * passes * per_pass + contexts_flops})
    if rule == "interventions":
        icfg = InterventionsConfig.from_dict(config.get("interventions"))
        n = _n_prompts(config, behaviour, icfg.max_prompts)
        passes = sum(perf.interventions_passes(cfg, n_hooks, d_sae, icfg).values())
        per_pass = perf.attribution_forward_flops_per_prompt(cfg, plen, n_hooks, d_sae)
        return Work({model_dtype: n * passes * per_pass})
    return None


def _model_dtype(config: dict) -> str:
    """The dtype the model computes in on a GPU: `model.dtype`, bf16 for `auto`."""
    dtype = config["model"].get("dtype", "auto")
    return "bfloat16" if dtype == "auto" else dtype


def work_seconds(config: dict, rule: str, cluster: Cluster, behaviour: str | None = None) -> float:
    """Seconds of a job's counted work at `cluster.peak_share` of its device's peak (the
    cluster's GPU where the rule gets one, else its threads' cores), the disk at
    `cluster.disk_mb_per_s`, plus the work that is neither; start-up not included."""
    work = job_work(config, rule, behaviour)
    if work is None:
        return 0.0
    gpu = gpus(config, rule)
    peaks = perf.NOMINAL_PEAK_FLOPS.get(cluster.gpu_type, perf.NOMINAL_PEAK_FLOPS["A100"])
    seconds = work.disk_bytes / (cluster.disk_mb_per_s * 1e6) + work.other_seconds
    for dtype, flops in work.flops.items():
        if gpu:  # a dtype the GPU has no peak for (bf16 on a T4) runs at its float16 rate
            peak = peaks.get(dtype) or peaks.get("float16") or peaks["float32"]
        else:
            peak = threads(config, rule) * cluster.cpu_core_peak_gflops * 1e9
        seconds += flops / (peak * cluster.peak_share)
    return seconds


def runtime(
    config: dict,
    rule: str,
    attempt: int = 1,
    cluster: Cluster | None = None,
    behaviour: str | None = None,
) -> int:
    """Walltime (minutes) of the `attempt`-th try: on attempt 1 the job's counted work at the
    cluster's conservative rate plus start-up (at most `resumable_max_runtime` for jobs that
    resume from checkpoints); `attempt` times that on a retry; never above `max_runtime`."""
    cluster = cluster or Cluster()
    if rule in LIGHT_RULES:
        minutes = LIGHT_RUNTIME
    else:
        work = work_seconds(config, rule, cluster, behaviour) / 60
        minutes = math.ceil(cluster.startup_minutes + work)
        if rule in RESUMABLE_RULES:
            minutes = min(minutes, cluster.resumable_max_runtime)
    minutes *= attempt
    return min(minutes, cluster.max_runtime) if cluster.max_runtime else minutes


# Checkpoints of one SAE while it trains: its weights and Adam's two moments, and a second such
# checkpoint while the next is written (the older one is removed after).
SAE_CHECKPOINT_COPIES = 2 * 3
# Tables, figures, logs, prompts and the embedded model's weights: a run's small files.
SMALL_FILES_BYTES = 2**30


def disk_plan(config: dict) -> dict[str, int]:
    """Bytes the configured run writes under `outdir` at its peak, by part: the activation files
    (rows x (d_in x the capture dtype + an int32 token)) and the token set, the SAEs, their
    checkpoints while every SAE trains at once, and the small files. Model weights go to the
    Hugging Face cache, not `outdir`, and are not counted."""
    cfg = architectures.model_cfg(config)
    capture, sae = config["capture"], config["sae"]
    n_hooks = len(config["layers"]) * len(config["sites"])
    itemsize = 2 if capture.get("dtype", "float16") == "float16" else 4
    rows = capture["n_tokens"]
    d_sae = sae.get("d_sae") or sae["expansion_factor"] * cfg.d_model
    weights = 4 * (2 * cfg.d_model * d_sae + d_sae + cfg.d_model)
    return {
        "activations": n_hooks * rows * (cfg.d_model * itemsize + 4) + 4 * 2 * rows,
        "saes": n_hooks * weights,
        "sae_checkpoints": n_hooks * SAE_CHECKPOINT_COPIES * weights,
        "small_files": SMALL_FILES_BYTES,
    }
