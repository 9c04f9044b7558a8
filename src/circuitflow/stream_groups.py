"""Which sites and layers share an SAE job, fixed when the DAG is built: the streaming jobs
(`sae.source: stream`), which train a group's SAEs from the same forward passes, and the
published dictionaries' jobs (`sae.source: pretrained`), which evaluate a group's dictionaries
one after another with the model loaded once. Both are grouped by `sae.stream.layers_per_job`
(`split`: consecutive layers) and name a group by one key (`StreamGroup.key`), which the rule
table passes to the rule's plan module. Beside the rule table rather than in a stage's plan
because `auto` asks the rule table (circuitflow.resources, which imports every plan module)
whether the job gets a GPU and how long its work takes on the profile's cluster, and a stage's
floor is below the table's."""

from __future__ import annotations

from circuitflow import resources
from circuitflow.cluster import Cluster
from circuitflow.errors import ConfigError
from circuitflow.perf import GPU_MEMORY_BYTES
from circuitflow.sae import pretrained_plan
from circuitflow.sae.stream_plan import RULE, StreamGroup, group_bytes, split, stream_hooks

FRACTION = 0.8  # of a GPU's memory a job is planned into (as sae.batch_size auto plans)
PRETRAINED_RULE = "pretrained_sae"


def group_rule(config: dict) -> str:
    """The rule table's row of the config's grouped SAE jobs: pretrained_sae for published
    dictionaries, else train_sae_stream."""
    return PRETRAINED_RULE if config["sae"]["source"] == "pretrained" else RULE


def group_members(config: dict) -> list[tuple[str, int]]:
    """The (site, layer) of every dictionary the grouped jobs write, by layer."""
    if config["sae"]["source"] == "pretrained":
        return pretrained_plan.members(config)
    return stream_hooks(config)


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
    rule = group_rule(config)
    cluster = cluster or Cluster()
    if on_gpu is None:
        on_gpu = jobs_get_a_gpu(config, cluster)
    if config["model"]["name"] == "embedded" or not on_gpu:
        return 1
    budget = FRACTION * GPU_MEMORY_BYTES[cluster.gpu_type]
    for n in range(len(members), 0, -1):
        groups = split(members, n)
        if rule == RULE and max(group_bytes(config, g, "cuda") for g in groups) > budget:
            continue
        if cluster.max_runtime and n > 1:
            seconds = [resources.work_seconds(config, rule, cluster, g.key) for g in groups]
            if cluster.startup_minutes + max(seconds) / 60 > cluster.max_runtime:
                continue
        return n
    need = group_bytes(config, split(members, 1)[0], "cuda") / 2**30
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
    """The grouped SAE jobs of a `sae.source: stream` or `pretrained` config, fixed when the DAG
    is built."""
    return split(group_members(config), layers_per_job(config, cluster, on_gpu))
