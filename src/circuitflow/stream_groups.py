"""Which sites and layers share a streaming SAE job (`sae.stream.layers_per_job`), fixed when the
DAG is built: beside the rule table rather than in sae.stream_plan because `auto` asks the rule
table (circuitflow.resources, which imports every plan module) whether the job gets a GPU and
how long its work takes on the profile's cluster, and a stage's floor is below the table's."""

from __future__ import annotations

from circuitflow import resources
from circuitflow.cluster import Cluster
from circuitflow.errors import ConfigError
from circuitflow.perf import GPU_MEMORY_BYTES
from circuitflow.sae.stream_plan import RULE, StreamGroup, group_bytes, split, stream_hooks

FRACTION = 0.8  # of a GPU's memory a job is planned into (as sae.batch_size auto plans)


def layers_per_job(config: dict, cluster=None) -> int:
    """`sae.stream.layers_per_job`, `auto` resolved: one for the embedded model and on the CPU;
    on a GPU the most whose job the memory plan fits in FRACTION of the cluster's GPU
    (`gpu_type`, perf.GPU_MEMORY_BYTES) and, where the cluster caps walltime (`max_runtime`),
    whose counted work fits that cap. ConfigError when not even one fits the GPU."""
    spec = config["sae"]["stream"]["layers_per_job"]
    members = stream_hooks(config)
    if spec != "auto":
        return min(int(spec), len(members))
    if config["model"]["name"] == "embedded" or not resources.gpus(config, RULE):
        return 1
    cluster = cluster or Cluster()
    budget = FRACTION * GPU_MEMORY_BYTES[cluster.gpu_type]
    for n in range(len(members), 0, -1):
        groups = split(members, n)
        if max(group_bytes(config, g, "cuda") for g in groups) > budget:
            continue
        if cluster.max_runtime and n > 1:
            seconds = [resources.work_seconds(config, RULE, cluster, g.key) for g in groups]
            if cluster.startup_minutes + max(seconds) / 60 > cluster.max_runtime:
                continue
        return n
    need = group_bytes(config, split(members, 1)[0], "cuda") / 2**30
    raise ConfigError(
        f"sae.stream.layers_per_job: one SAE's streaming job needs about {need:.1f} GiB, more "
        f"than {FRACTION:.0%} of the profile's {cluster.gpu_type} ({budget / 2**30:.0f} GiB); "
        "use smaller sae.shuffle_buffer_tokens, sae.batch_size or sae.expansion_factor"
    )


def stream_groups(config: dict, cluster=None) -> list[StreamGroup]:
    """The streaming jobs of a `sae.source: stream` config, fixed when the DAG is built."""
    return split(stream_hooks(config), layers_per_job(config, cluster))
