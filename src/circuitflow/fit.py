"""Whether the configured run fits where it runs, checked before any job: the rule table's
plans (circuitflow.resources) of every job the workflow declares, against what its nodes offer
(a Slurm profile's `gpu_node_mem_gib`, `cpu_node_mem_gib` and `max_runtime`, circuitflow.cluster)
or, without one, this machine's memory; and the run's disk plan against the free disk under
`outdir`. A plan that cannot fit is refused in one line naming the config key that drives it
(`driver`: of the numeric keys, the one whose halving shrinks the plan most) and what is
offered, instead of a job failing hours in with numpy's or Slurm's words.

`problem` (the Snakefile's last lines, in the workflow's main process, dry runs included)
refuses, the first found in this order:
- the token set (capture_tokens' int32 [contexts, context length] array, from the key its
  dictionary source names: `sae.total_tokens` for `sae.source: stream`, else `capture.n_tokens`)
  larger than the memory of the node or machine that builds it;
- a job's planned host memory (resources.mem_mb on a Slurm profile, what sbatch asks for;
  its planned peak, resources.job_peak_bytes, on this machine) above a node's or this
  machine's memory;
- a job that cannot resume from a checkpoint whose first attempt's planned walltime (its
  counted work and start-up, not capped) exceeds the profile's `max_runtime`.

`disk_problem`: the run's disk plan (resources.disk_plan), less what `outdir` already holds,
above the free disk there. Free disk is the moment's, not the machine's: a dry run only warns
(it may plan a run for later, or a cluster's larger disk), and the run itself is refused when
it starts (the workflow's `onstart`, before any job).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from circuitflow import dictionary_sources, resources
from circuitflow.capture.plan import context_length, token_set_contexts
from circuitflow.cluster import Cluster
from circuitflow.model import architectures
from circuitflow.schema import schema_defaults

GiB = 2**30
TiB = 2**40
# Sections whose numbers describe the model, the run's seed or its layers: not what a user
# shrinks to make a plan fit.
FIXED_SECTIONS = ("seed", "model", "embedded", "layers", "device", "outdir")
# The key named when no numeric key shrinks a plan (a real model's own size).
MODEL_KEY = "model.name"
TOKEN_BYTES = 4  # the token set is int32 (capture/tokens.py)


@dataclass(frozen=True)
class Machine:
    """What this machine offers: its memory (what the jobs get where no Slurm profile states
    a cluster), the free disk under `outdir` and what `outdir` already holds (a rerun writes
    only the rest)."""

    memory: int
    free_disk: int
    used_disk: int = 0

    @classmethod
    def here(cls, outdir: Path | str | None = None) -> Machine:
        """This machine; its disk under `outdir` (None: its memory alone, no disk counted)."""
        if outdir is None:
            return cls(memory_bytes(), free_disk=0)
        return cls(memory_bytes(), free_disk_bytes(outdir), used_bytes(outdir))


def memory_bytes() -> int:
    """This machine's memory: psutil's total, else /proc/meminfo's, capped by a cgroup limit
    (a container, a Slurm allocation)."""
    total = None
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except ImportError:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
        except OSError:
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max" and total is not None:
            total = min(total, int(limit))
    except (OSError, ValueError):
        pass
    return total if total is not None else 2**62  # unknown: nothing refused


def existing_parent(path: Path | str) -> Path:
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_disk_bytes(outdir: Path | str) -> int:
    """Free bytes on the file system that holds `outdir` (its nearest existing parent)."""
    return shutil.disk_usage(existing_parent(outdir)).free


def used_bytes(outdir: Path | str) -> int:
    """Bytes of the files already under `outdir` (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(outdir):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


# --- which key drives a plan ----------------------------------------------------------------------
def numeric_keys(config: dict, prefix: str = "") -> Iterable[tuple[str, list[str]]]:
    """(dotted key, path) of every number in `config` a user may shrink (FIXED_SECTIONS left
    out)."""
    for key, value in config.items():
        if not prefix and key in FIXED_SECTIONS:
            continue
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            for dotted, inner in numeric_keys(value, f"{path}."):
                yield dotted, [key, *inner]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield path, [key]


def halved(config: dict, path: list[str]) -> dict | None:
    """`config` with the number at `path` halved (whole numbers stay whole), or None when it is
    too small to halve."""
    out = copy.deepcopy(config)
    node = out
    for key in path[:-1]:
        node = node[key]
    value = node[path[-1]]
    if isinstance(value, int):
        if value < 2:
            return None
        node[path[-1]] = value // 2
    elif value > 0:
        node[path[-1]] = value / 2
    else:
        return None
    return out


def driver(config: dict, measure: Callable[[dict], float]) -> str:
    """The config key that drives `measure(config)` (a plan's bytes or seconds): of the numeric
    keys, the one whose halving shrinks it most (the first such in the config's order),
    looking first among the keys the config sets away from the schema's defaults (the ones its
    user touched: `features.k` rather than `sae.expansion_factor`, whose halving shrinks a
    features job as much); MODEL_KEY when none shrinks it (the model's own size)."""
    base = measure(config)
    keys = list(numeric_keys(config))
    defaults = schema_defaults()
    touched = [(dotted, path) for dotted, path in keys if _at(defaults, path) != _at(config, path)]
    for pool in (touched, keys):
        best, best_ratio = None, 0.99
        for dotted, path in pool:
            smaller = halved(config, path)
            if smaller is None:
                continue
            try:
                ratio = measure(smaller) / base
            except Exception:  # a halved value the plan cannot take: not this key
                continue
            if ratio < best_ratio:
                best, best_ratio = dotted, ratio
        if best is not None:
            return best
    return MODEL_KEY


def _at(config: dict, path: list[str]):
    """The value at `path` in `config`, or None where it has none."""
    node = config
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def key_value(config: dict, dotted: str) -> str:
    """`dotted`'s value as the message shows it (`900,000,000,000`)."""
    value = config
    for key in dotted.split("."):
        value = value[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def size(n_bytes: float) -> str:
    """`n_bytes` in the unit that shows it (a test run's MiB read "0.0 GiB" before)."""
    if n_bytes >= TiB:
        return f"{n_bytes / TiB:,.1f} TiB"
    if n_bytes < 0.1 * GiB:
        return f"{n_bytes / 2**20:.1f} MiB"
    return f"{n_bytes / GiB:,.0f} GiB" if n_bytes >= 10 * GiB else f"{n_bytes / GiB:.1f} GiB"


def hours(minutes: float) -> str:
    """Hours to a tenth, rounded up: a plan just above the cap does not read as equal."""
    return f"{math.ceil(minutes / 6) / 10:,.1f} h"


# --- the check ------------------------------------------------------------------------------------
def token_set_bytes(config: dict) -> int:
    """Bytes of the token set capture_tokens builds (int32 [contexts, context length])."""
    cfg = architectures.model_cfg(config)
    return TOKEN_BYTES * token_set_contexts(config) * context_length(config, cfg)


def job_label(rule: str, job: str | None) -> str:
    return f"{rule} ({job})" if job else rule


def node_memory(config: dict, rule: str, cluster: Cluster, machine: Machine) -> tuple[int, str]:
    """(bytes, words) of the memory a job of `rule` can have: a node of its partition on a
    Slurm profile, else this machine's."""
    if not cluster.stated:
        return machine.memory, f"this machine has {size(machine.memory)} of memory"
    if resources.gpus(config, rule) and cluster.gpu_partition:
        gib, setting = cluster.gpu_node_mem_gib, "gpu_node_mem_gib"
        where = f"a node of partition {cluster.gpu_partition}"
    else:
        gib, setting, where = cluster.cpu_node_mem_gib, "cpu_node_mem_gib", "a CPU node"
    return gib * GiB, f"{where} has {gib:,} GiB (the profile's {setting})"


def job_memory(config: dict, rule: str, job: str | None, cluster: Cluster) -> int:
    """A job's host memory as planned: on a Slurm profile what sbatch asks for (mem_mb, the
    plan with its headroom), on this machine the planned peak."""
    if cluster.stated:
        return resources.mem_mb(config, rule, 1, job) * resources.MB
    return resources.job_peak_bytes(config, rule, resources.device(config, rule), job)


def first_minutes(config: dict, rule: str, job: str | None, cluster: Cluster) -> float:
    """A job's first walltime as planned before any cap: start-up and its counted work."""
    return cluster.startup_minutes + resources.work_seconds(config, rule, cluster, job) / 60


def problem(
    config: dict,
    jobs: Iterable[tuple[str, str | None]],
    cluster: Cluster,
    machine: Machine,
) -> str | None:
    """Why the configured run cannot fit, in one line naming the config key, or None. `jobs`:
    (rule, job) of every job the workflow declares (a rule's row in resources.RULES, and the
    stream group's key for train_sae_stream's jobs; None: every job of the rule, its largest
    behaviour)."""
    jobs = list(dict.fromkeys(jobs))
    rules = {rule for rule, _ in jobs}
    if "capture_tokens" in rules:
        need = token_set_bytes(config)
        have, offer = node_memory(config, "capture_tokens", cluster, machine)
        if need > have:
            key = dictionary_sources.token_set_source(config).token_set_key
            return (
                f"{key}: {key_value(config, key)} tokens a layer need a {size(need)} token set in "
                f"capture_tokens; {offer}"
            )
    for rule, job in jobs:
        need = job_memory(config, rule, job, cluster)
        have, offer = node_memory(config, rule, cluster, machine)
        if need > have:
            key = driver(config, lambda c, r=rule, j=job: job_memory(c, r, j, cluster))
            return (
                f"{key}: {key_value(config, key)} plans {size(need)} of host memory for "
                f"{job_label(rule, job)}; {offer}"
            )
    if cluster.max_runtime:
        for rule, job in jobs:
            entry = resources.rule_of(rule)
            if entry.resumable or resources.CLASSES[entry.resource_class].minutes is not None:
                continue
            minutes = first_minutes(config, rule, job, cluster)
            if minutes > cluster.max_runtime:
                key = driver(config, lambda c, r=rule, j=job: first_minutes(c, r, j, cluster))
                return (
                    f"{key}: {key_value(config, key)} plans {hours(minutes)} for "
                    f"{job_label(rule, job)}, which cannot resume from a checkpoint; the "
                    f"profile's max_runtime is {hours(cluster.max_runtime)}"
                )
    return None


def held_plan(config: dict) -> dict[str, int]:
    """The disk plan's parts held against the free disk: all but the fixed allowance for the
    run's small files (resources.SMALL_FILES_BYTES, a Slurm request's margin of 1 GiB, not a
    measure: the embedded default writes a few MB of them)."""
    return {k: v for k, v in resources.disk_plan(config).items() if k != "small_files"}


def disk_problem(config: dict, machine: Machine) -> str | None:
    """Why the run's large files (held_plan, less what `outdir` already holds) cannot fit the
    free disk under `outdir`, in one line naming the config key, or None."""
    plan = held_plan(config)
    need = sum(plan.values()) - machine.used_disk
    if need <= machine.free_disk:
        return None
    key = driver(config, lambda c: sum(held_plan(c).values()))
    total = sum(plan.values())
    parts = ", ".join(
        f"{k.replace('_', ' ')} {size(v)}" for k, v in plan.items() if v >= total / 100
    )
    held = f", less {size(machine.used_disk)} already there" if machine.used_disk else ""
    return (
        f"{key}: {key_value(config, key)} plans {size(total)} under outdir "
        f"{config['outdir']} ({parts}{held}); {size(machine.free_disk)} free there"
    )
