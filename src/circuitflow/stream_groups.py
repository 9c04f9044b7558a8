"""Which sites and layers share a dictionary job, fixed when the DAG is built, for a grouped
dictionary source (circuitflow.dictionary_sources: `grouped`): the streaming jobs
(`sae.source: stream`), which train a group's SAEs from the same forward passes, and the
published dictionaries' jobs (`sae.source: pretrained`), which evaluate a group's dictionaries
one after another with the model loaded once. Both are grouped by `sae.stream.layers_per_job`
(`split`: consecutive layers) and name a group by one key (`StreamGroup.key`), which the rule
table passes to the rule's plan module. Beside the rule table rather than in a stage's plan
because `auto` asks the rule table (circuitflow.resources, which imports every plan module)
whether the job gets a GPU and how long its work takes on the profile's cluster, and a stage's
floor is below the table's."""

from __future__ import annotations

from circuitflow import dictionary_sources, resources
from circuitflow.cluster import Cluster
from circuitflow.errors import ConfigError
from circuitflow.perf import GPU_MEMORY_BYTES
from circuitflow.sae.stream_plan import StreamGroup, split

FRACTION = 0.8  # of a GPU's memory a job is planned into (as sae.batch_size auto plans)


def group_rule(config: dict) -> str:
    """The rule table's row of the config's grouped dictionary jobs (its source's `rule`:
    train_sae_stream, pretrained_sae)."""
    return dictionary_sources.get(config).rule


def group_plan(config: dict):
    """The plan module of the config's grouped dictionary jobs (the rule table's)."""
    source = dictionary_sources.get(config)
    if not source.grouped:
        raise ValueError(f"sae.source {source.name}: its jobs are one per dictionary, not grouped")
    return resources.rule_of(source.rule).plan


def group_members(config: dict) -> list[tuple[str, int]]:
    """The (site, layer) of every dictionary the grouped jobs write, by layer (the plan's
    `members`)."""
    return group_plan(config).members(config)


def layers_per_job(config: dict, cluster=None, on_gpu: bool | None = None) -> int:
    """`sae.stream.layers_per_job`, `auto` resolved: one for the embedded model and on the CPU;
    on a GPU the most whose job fits: for streaming, whose memory plan fits in FRACTION of the
    cluster's GPU (`gpu_type`, perf.GPU_MEMORY_BYTES) and, where the cluster caps walltime
    (`max_runtime`), whose counted work fits that cap; for published dictionaries, whose work
    fits the cap (a job holds one dictionary at a time, so its memory is one member's).
    ConfigError when not even one streamed SAE fits the GPU. `on_gpu`: whether the jobs get a
    GPU (None: jobs_get_a_gpu decides; the GPU-hours estimate says True)."""
    spec = config["sae"]["stream"]["layers_per_job"]
    members = group_members(config)
    if spec != "auto":
        return min(int(spec), len(members))
    source, plan = dictionary_sources.get(config), group_plan(config)
    rule = source.rule
    cluster = cluster or Cluster()
    if config["model"]["name"] == "embedded":
        return 1
    if on_gpu is None:  # asks torch whether this machine has a GPU where no profile says
        on_gpu = jobs_get_a_gpu(config, cluster)
    if not on_gpu:
        return 1
    budget = FRACTION * GPU_MEMORY_BYTES[cluster.gpu_type]
    for n in range(len(members), 0, -1):
        groups = split(members, n)
        if source.holds_group and max(plan.group_bytes(config, g, "cuda") for g in groups) > budget:
            continue
        if cluster.max_runtime and n > 1:
            seconds = [resources.work_seconds(config, rule, cluster, g.key) for g in groups]
            if cluster.startup_minutes + max(seconds) / 60 > cluster.max_runtime:
                continue
        return n
    need = plan.group_bytes(config, split(members, 1)[0], "cuda") / 2**30
    raise ConfigError(
        f"sae.stream.layers_per_job: one SAE's streaming job needs about {need:.1f} GiB, more "
        f"than {FRACTION:.0%} of the profile's {cluster.gpu_type} ({budget / 2**30:.0f} GiB); "
        "use smaller sae.shuffle_buffer_tokens, sae.batch_size or sae.expansion_factor"
    )


def jobs_get_a_gpu(config: dict, cluster: Cluster) -> bool:
    """Whether the grouped jobs run on a GPU: the rule gets one (`device` is not cpu) and
    either a Slurm profile sends GPU jobs to a GPU partition or, run here (no partition: the
    workstation profile), this machine has one (`device: auto` on a laptop runs on its CPU)."""
    if not resources.gpus(config, group_rule(config)):
        return False
    if cluster.gpu_partition is not None:
        return True
    import torch

    return torch.cuda.is_available()


def stream_groups(config: dict, cluster=None, on_gpu: bool | None = None) -> list[StreamGroup]:
    """The grouped dictionary jobs of a config whose source groups them (`sae.source: stream`
    or `pretrained`), fixed when the DAG is built."""
    return split(group_members(config), layers_per_job(config, cluster, on_gpu))
