"""Cluster facts: what the workflow knows of the machines its jobs run on, read from the profile.

A Slurm profile states its cluster among its `default-resources` (Snakemake parses that file
before it picks the executor, so these entries are how rules see the cluster); `Cluster` is
every setting the workflow reads, with its default, and profiles/README.md lists them. The
defaults are those of CSD3's A100 nodes; on a workstation (profiles/default states none) only
the walltimes read them, and local execution ignores walltimes. Adding a cluster is one profile
folder: nothing here names one.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, fields
from typing import Any

from circuitflow.errors import ConfigError

# `${VAR}` or `$VAR` in a profile value: the environment variable a user sets (CSD3_ACCOUNT).
ENV_VAR = re.compile(r"\$\{?(\w+)\}?")
SUFFIX = re.compile(r"-(CPU|GPU)$", re.IGNORECASE)


def setting_value(raw: Any) -> Any:
    """A profile's default-resource as a value: environment variables expanded, quotes and
    numbers parsed (`"'A100'"` -> 'A100', `"50"` -> 50)."""
    if not isinstance(raw, str):
        return raw
    value = os.path.expandvars(raw)
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


@dataclass(frozen=True)
class Cluster:
    """Every profile setting the workflow reads (whole numbers or strings: Snakemake keeps
    resources as those). `gpu_peak_percent` is the conservative part of a walltime: the share
    of the GPU's datasheet peak a job is assumed to reach (the GPU suite measured its stages at
    40-80% of a CPU's measured peak, benchmarks/results/cpu.json)."""

    # Where jobs go (Snakemake's Slurm plugin reads slurm_account and slurm_partition itself).
    slurm_account: str | None = None  # CPU jobs
    gpu_account: str | None = None  # GPU jobs; None: slurm_account
    gpu_partition: str | None = None  # None: GPU jobs get no partition, account or GRES
    gpu_gres: str | None = None  # GRES name of a GPU request; '' on a cluster without GPUs
    envmodules: str | None = None  # module every job loads (software-deployment-method)
    account_hint: str = "set slurm_account (and gpu_account) in your profile"
    # What a node offers.
    cpus_per_gpu: int = 32  # CSD3 ampere: 4 A100s and 128 cores a node
    gpu_node_mem_gib: int = 1000  # host memory of a GPU partition's node (CSD3 ampere)
    cpu_node_mem_gib: int = 256  # host memory of a CPU partition's node (CSD3 icelake)
    gpu_type: str = "A100"  # a key of perf.NOMINAL_PEAK_FLOPS: walltimes and the report's hours
    # How walltimes are planned (circuitflow.resources.runtime).
    gpu_peak_percent: int = 5
    # Where the GPU suite measured the profile's gpu_type (circuitflow.measured): the share of
    # each stage's measured rate a walltime plans for (jobs share nodes, sizes differ).
    measured_rate_percent: int = 50
    cpu_core_peak_gflops: int = 50  # fp32 per core, jobs without a GPU (AVX-512 at ~3 GHz: 96)
    disk_mb_per_s: int = 50  # activation files written or read (Lustre under load)
    startup_minutes: int = 10  # imports, loading the model and SAEs, CUDA start
    resumable_max_runtime: int = 240  # minutes: first attempt of a job that resumes
    max_runtime: int | None = None  # minutes: the cluster's limit (every attempt)
    # Retries of a job that resumes from checkpoints where walltime is capped: at least this
    # many, more where its attempts would not cover its planned work (resources.retries).
    resumable_retries: int = 2
    # The environment variable the accounts are built from (`${CSD3_ACCOUNT}-CPU`), if any.
    account_variable: str | None = None
    # Whether the profile states a cluster (any setting above): its nodes run the jobs, else
    # this machine does (circuitflow.fit).
    stated: bool = False

    def __post_init__(self) -> None:
        from circuitflow.perf import NOMINAL_PEAK_FLOPS

        if self.gpu_type not in NOMINAL_PEAK_FLOPS:
            raise ConfigError(
                f"gpu_type: {self.gpu_type!r} in the profile's default-resources has no datasheet "
                f"peak; allowed values: {', '.join(NOMINAL_PEAK_FLOPS)} (add one to "
                "circuitflow.perf.NOMINAL_PEAK_FLOPS)"
            )

    @classmethod
    def from_profile(cls, default_resources: dict[str, Any]) -> Cluster:
        """From a profile's default-resources as Snakemake holds them (values unparsed)."""
        raw = {k: getattr(v, "raw", v) for k, v in (default_resources or {}).items()}
        derived = ("account_variable", "stated")
        values = {
            f.name: setting_value(raw[f.name])
            for f in fields(cls)
            if f.name in raw and f.name not in derived
        }
        found = ENV_VAR.search(str(raw.get("slurm_account", "")))
        variable = found.group(1) if found else None
        return cls(**values, account_variable=variable, stated=bool(values))

    @property
    def peak_share(self) -> float:
        return self.gpu_peak_percent / 100

    @property
    def measured_share(self) -> float:
        return self.measured_rate_percent / 100

    def gpu_job_account(self) -> str | None:
        return self.gpu_account or self.slurm_account

    def account_problem(self) -> str | None:
        """Why the profile's accounts cannot work, in one line, or None (no account set: sbatch
        uses the user's default). A profile that adds -CPU or -GPU to a variable
        (`${CSD3_ACCOUNT}-GPU`) gets the suffix twice when the variable has it already
        (CSD3_ACCOUNT=PROJECT-SL2-GPU, the form CSD3's `mybalance` prints), and sbatch would
        refuse every job."""
        for key in ("slurm_account", "gpu_account"):
            account = getattr(self, key)
            if account is None:
                continue
            account = str(account)
            if not account or "$" in account or account.startswith("-"):
                return f"Slurm account not set ({key} = {account!r}): {self.account_hint}"
            if SUFFIX.search(SUFFIX.sub("", account)):
                base = SUFFIX.sub("", SUFFIX.sub("", account))
                fix = (
                    f"set {self.account_variable}={base} without it"
                    if self.account_variable
                    else f"edit {key} in your profile"
                )
                return (
                    f"Slurm account {account!r} ({key}) ends in the -CPU/-GPU suffix twice: "
                    f"{fix}; the profile adds -GPU for GPU jobs and -CPU for the rest"
                )
        return None
