"""The rule table: every rule's job resources (GPUs, CPUs, host memory, walltime) in one place.

Each rule names one resource class (`RULES`), and `CLASSES` maps a class to its GPUs, threads
and walltime; the rule adds what its process imports (its runtime memory,
memory.runtime.RUNTIME_MB) and its stage's plan module (`<stage>/plan.py`, or baseline_plan.py):
`job_bytes` (the host memory of its work at the config's batch sizes) and `job_work` (its counted
work: FLOPs of its passes, bytes through the disk). The rules call these through the helpers at
the end of workflow/rules/common.smk; a Slurm profile turns them into sbatch options, and states
the cluster they assume (circuitflow.cluster.Cluster).

- memory: the job's runtime plus its work, with MEM_HEADROOM (plans are checked within 25% of
  measured peaks by tests/test_memory_accuracy.py);
- walltime: the counted work at the cluster's stated, conservative share of its device's
  peak, plus start-up; jobs that resume from checkpoints start with at most a few hours;
- both grow linearly with Snakemake's `attempt` (1, 2, ...): a job killed for memory or
  walltime gets more on its retry, never above the cluster's `max_runtime`.

A new rule is one line in RULES (with a plan module if it does counted work); a dictionary
source's rules come from its record (circuitflow.dictionary_sources, `source_rules`).
tests/test_resources.py checks that every rule the workflow declares is here. Override a rule
with `--set-resources RULE:runtime=...` if needed.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

from circuitflow import baseline_plan, dictionary_sources, measured, perf, provenance
from circuitflow.attribution import plan as attribution_plan
from circuitflow.attribution.prompt_graphs import plan as prompt_graphs_plan
from circuitflow.capture import plan as capture_plan
from circuitflow.cluster import Cluster
from circuitflow.description import describe
from circuitflow.features import browser_plan, explainer_plan
from circuitflow.features import plan as features_plan
from circuitflow.interventions import plan as interventions_plan
from circuitflow.memory import runtime_bytes
from circuitflow.model import plan as model_plan
from circuitflow.sae import plan as sae_plan


@dataclass(frozen=True)
class ResourceClass:
    """What the rules of a class get (for a real model; the embedded model's jobs get one
    thread: see `threads`)."""

    gpu: bool  # one GPU unless the config pins `device: cpu`
    threads: int
    minutes: int | None = None  # a fixed walltime; None: from the job's counted work


CLASSES = {
    # The model and SAE stages: 8 CPUs beside the GPU (data loading, HDF5, tokenisation).
    "gpu": ResourceClass(gpu=True, threads=8),
    # Work on the CPU: training the embedded model, tokenising, prompts, provenance.
    "cpu": ResourceClass(gpu=False, threads=4),
    # Pages and tables read from small files: one core, 15 minutes.
    "light": ResourceClass(gpu=False, threads=1, minutes=15),
}


@dataclass(frozen=True)
class Rule:
    resource_class: str  # a key of CLASSES
    imports: str  # what its process imports (memory.runtime.RUNTIME_MB's kind)
    plan: ModuleType | None = None  # its stage's job_bytes and job_work; None: no counted work
    resumable: bool = False  # checkpoints on SIGTERM and resumes: a shorter first attempt
    imports_embedded: str | None = None  # what it imports for the embedded model, if less


def source_rules() -> dict[str, Rule]:
    """The rows of every dictionary source's rules, from its record: the rule that makes its
    dictionaries on a GPU (resumable where it trains them), its prefetch on the login node, both
    with the source's plan. A rule two sources share keeps the first's row."""
    rows: dict[str, Rule] = {}
    for source in dictionary_sources.SOURCES.values():
        plan = importlib.import_module(source.plan)
        if source.prefetch_rule:
            rows.setdefault(source.prefetch_rule, Rule("cpu", "model", plan))
        rows.setdefault(source.rule, Rule("gpu", "model", plan, resumable=source.trains))
    return rows


RULES = {
    "train_model": Rule("cpu", "model", model_plan),
    "prefetch_model": Rule("cpu", "model", model_plan),  # a localrule: the login node
    "prompts": Rule("cpu", "model", imports_embedded="tokenizer"),  # a real model's tokenizer
    "baseline": Rule("gpu", "model", baseline_plan),
    "provenance": Rule("cpu", "base"),
    "capture_tokens": Rule("cpu", "model", capture_plan, imports_embedded="arrays"),
    "capture": Rule("gpu", "model", capture_plan, resumable=True),
    "capture_shard": Rule("gpu", "model", capture_plan, resumable=True),
    "merge_capture": Rule("cpu", "base"),
    # train_sae, train_sae_stream (one rule per group: stream_groups), prefetch_saes (a
    # localrule: the login node), pretrained_sae: each dictionary source's rules.
    **source_rules(),
    "transcoder_replacement": Rule("gpu", "model", sae_plan),  # sae.kind transcoder
    # the contexts labels are scored on; then one rule per group of layers
    # (features.layers_per_job): features_{group.name}
    "held_out_tokens": Rule("cpu", "model", features_plan, imports_embedded="arrays"),
    "features": Rule("gpu", "model", features_plan, resumable=True),
    # features.labeller naming a language model: its prefetch (a localrule: the login node),
    # then one job per group: explain_features_{group.name}
    "prefetch_explainer": Rule("cpu", "model"),
    "explain_features": Rule("gpu", "model", explainer_plan, resumable=True),
    "attribution": Rule("gpu", "model", attribution_plan),
    "prompt_graphs": Rule("gpu", "model", prompt_graphs_plan),  # sae.kind transcoder
    "interventions": Rule("gpu", "model", interventions_plan),
    # figures of every behaviour or dictionary at once: they peak as job_costs's does
    "interventions_across": Rule("light", "costs"),
    "sae_summary": Rule("light", "costs"),
    "report_baseline": Rule("light", "pages"),
    "report_behaviour": Rule("light", "report"),
    "report_provenance": Rule("light", "pages"),
    # the feature browser: a page per dictionary (grows with its features), and their index
    "report_features_dictionary": Rule("light", "pages", browser_plan),
    "report_features": Rule("light", "pages"),
    "report_gpu_hours": Rule("light", "pages"),  # plans real models from their shapes alone
    "provenance_run": Rule("light", "config", provenance),  # stdlib and the distributions
    "job_costs": Rule("light", "costs"),
}
GPU_RULES = frozenset(name for name, rule in RULES.items() if CLASSES[rule.resource_class].gpu)
# Rules the workflow defines once per group of layers, each named `<rule>_<group>`: the grouped
# dictionary sources' and the features stage's.
PER_GROUP_RULES = frozenset(
    [s.rule for s in dictionary_sources.SOURCES.values() if s.grouped]
    + ["features", "explain_features"]
)
# Slurm's memory limit over the job's plan (within 25% of measured peaks): a plan that fell 25%
# short still fits.
MEM_HEADROOM = 1.25
MB = 2**20


def rule_of(name: str) -> Rule:
    """`name`'s row: in RULES, or of a dictionary source registered since (source_rules)."""
    if entry := RULES.get(name) or source_rules().get(name):
        return entry
    raise KeyError(f"rule {name!r} is not in circuitflow.resources.RULES: add it there")


def embedded(config: dict) -> bool:
    return config["model"]["name"] == "embedded"


def gpus(config: dict, rule: str) -> int:
    """GPUs for one job: 1 for model and SAE work unless the config pins `device: cpu`."""
    return int(CLASSES[rule_of(rule).resource_class].gpu and config["device"] != "cpu")


def device(config: dict, rule: str) -> str:
    """Where a job's work is planned: on a GPU where the rule gets one."""
    return "cuda" if gpus(config, rule) else "cpu"


def threads(config: dict, rule: str, cluster: Cluster | None = None) -> int:
    """CPUs for one job. The embedded model's jobs take one core each and run side by side: its
    matrices are too small for a second thread to pay much (1.4x for train_model), OpenMP
    threads that find their core busy spin (slowing a job ~10x), and a thread count that
    followed the machine's cores would change the trained weights (reductions split
    differently: 2e-4 after 30 steps), so a laptop and a cluster would disagree. Real models get
    their class's threads, at most the cluster's CPUs per GPU."""
    cls = CLASSES[rule_of(rule).resource_class]
    if embedded(config) or cls.minutes is not None:
        return 1
    n_gpus = gpus(config, rule)
    n = cls.threads if n_gpus else CLASSES["cpu"].threads  # a GPU rule pinned to the CPU
    return min(n, (cluster or Cluster()).cpus_per_gpu * max(1, n_gpus))


def job_peak_bytes(
    config: dict, rule: str, device_name: str = "cpu", job: str | None = None
) -> int:
    """A job's planned peak resident memory on the host (what mem_mb asks Slurm for, less its
    headroom): its process's runtime (what it imports, the CUDA runtime on a GPU) plus its work
    (its plan module's job_bytes: the host's share on a GPU). tests/test_memory_accuracy.py
    checks every default-DAG job against its measured max_rss. `job`: which of the rule's jobs,
    where they differ (train_sae_stream: its group's key)."""
    entry = rule_of(rule)
    kind = entry.imports_embedded if embedded(config) and entry.imports_embedded else entry.imports
    args = (job,) if job else ()
    # A dictionary source's rule plans the part of the run it makes (all of it, but for SAEs
    # and transcoders from different sources).
    part = dictionary_sources.part_of_rule(config, rule)
    work = entry.plan.job_bytes(part, rule, device_name, *args) if entry.plan else 0
    return runtime_bytes(kind, device_name) + work


def mem_mb(config: dict, rule: str, attempt: int = 1, job: str | None = None) -> int:
    """Host memory (MB) for one job on its `attempt`-th try: the planned peak (job_peak_bytes,
    on a GPU where the rule gets one) with MEM_HEADROOM, times the attempt."""
    peak = job_peak_bytes(config, rule, device(config, rule), job)
    return math.ceil(peak * MEM_HEADROOM / MB) * attempt


def job_work(config: dict, rule: str, behaviour: str | None = None) -> perf.Work | None:
    """The counted work of one job of `rule` (for `behaviour` where the rule runs per
    behaviour; train_sae_stream: its group's key), from the config alone; None for rules that
    count none."""
    entry = rule_of(rule)
    part = dictionary_sources.part_of_rule(config, rule)  # as job_peak_bytes plans it
    return entry.plan.job_work(part, rule, behaviour) if entry.plan else None


def measured_rates(config: dict, rule: str, cluster: Cluster) -> dict[str, float] | None:
    """FLOP/s by dtype that the GPU suite measured for this rule's stage on the cluster's GPU
    type (circuitflow.measured), or None where nothing was measured: the rule gets no GPU,
    no suite result names that GPU, or the rule's stage is not in it."""
    if not gpus(config, rule):
        return None
    return measured.rule_rates(cluster.gpu_type, rule, describe(config).model.architecture)


def work_seconds(config: dict, rule: str, cluster: Cluster, behaviour: str | None = None) -> float:
    """Seconds of a job's counted work, plus the disk at `cluster.disk_mb_per_s` and the work
    that is neither; start-up not included. The FLOPs run at `cluster.measured_share` of the
    rate the GPU suite measured for the rule's stage on the cluster's GPU type where one was
    measured (measured_rates), else at `cluster.peak_share` of the device's datasheet peak
    (the cluster's GPU where the rule gets one, else its threads' cores)."""
    work = job_work(config, rule, behaviour)
    if work is None:
        return 0.0
    gpu = gpus(config, rule)
    peaks = perf.NOMINAL_PEAK_FLOPS[cluster.gpu_type]
    rates = measured_rates(config, rule, cluster)
    seconds = work.disk_bytes / (cluster.disk_mb_per_s * 1e6) + work.other_seconds
    for dtype, flops in work.flops.items():
        if rates:
            seconds += flops / (rates.get(dtype, rates["*"]) * cluster.measured_share)
            continue
        if gpu:  # a dtype the GPU has no peak for (bf16 on a T4) runs at its float16 rate
            peak = peaks.get(dtype) or peaks.get("float16") or peaks["float32"]
        else:
            peak = threads(config, rule, cluster) * cluster.cpu_core_peak_gflops * 1e9
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
    resume from checkpoints; the class's fixed minutes for light rules); `attempt` times that
    on a retry; never above `max_runtime`."""
    cluster = cluster or Cluster()
    entry = rule_of(rule)
    minutes = CLASSES[entry.resource_class].minutes
    if minutes is None:
        work = work_seconds(config, rule, cluster, behaviour) / 60
        minutes = math.ceil(cluster.startup_minutes + work)
        if entry.resumable:
            minutes = min(minutes, cluster.resumable_max_runtime)
    minutes *= attempt
    return min(minutes, cluster.max_runtime) if cluster.max_runtime else minutes


# A job that cannot cover its work in this many attempts is refused by the plan instead.
MAX_ATTEMPTS = 20


def retries(config: dict, rule: str, cluster: Cluster, job: str | None = None) -> int | None:
    """Retries of a job that resumes from its checkpoints where the cluster caps walltime
    (`max_runtime`): `cluster.resumable_retries`, or more where its attempts would not cover
    its planned work otherwise (each attempt's walltime, runtime, less its start-up counts
    towards the work: the rest is saved in checkpoints). None (the profile's `retries`) for
    other rules and where walltime is not capped."""
    if not rule_of(rule).resumable or not cluster.max_runtime:
        return None
    work = work_seconds(config, rule, cluster, job) / 60
    covered, attempt = 0.0, 0
    while covered < work and attempt < MAX_ATTEMPTS:
        attempt += 1
        covered += runtime(config, rule, attempt, cluster, job) - cluster.startup_minutes
    return max(cluster.resumable_retries, attempt - 1)


# Tables, figures, logs, prompts and the embedded model's weights: a run's small files.
SMALL_FILES_BYTES = 2**30


def disk_plan(config: dict) -> dict[str, int]:
    """Bytes the configured run writes under `outdir` at its peak, by part (each stage's
    plan.disk_bytes): the activation files and token set, the SAEs, their checkpoints while
    every SAE trains at once, and the small files. Model weights go to the Hugging Face cache,
    not `outdir`, and are not counted."""
    return {
        "activations": capture_plan.disk_bytes(config),
        **sae_plan.disk_bytes(config),
        "small_files": SMALL_FILES_BYTES,
    }
