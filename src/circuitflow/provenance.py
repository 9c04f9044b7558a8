"""What produced a result: software, hardware, job and code versions."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "torch",
    "transformer-lens",
    "sae-lens",
    "snakemake",
    "snakemake-executor-plugin-slurm",
    "transformers",
    "h5py",
    "numpy",
    "pandas",
    "safetensors",
    "circuitflow",
)
SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_ACCOUNT",
    "SLURM_CLUSTER_NAME",
)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(repo: Path) -> dict:
    commit = _run(["git", "rev-parse", "HEAD"], repo)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], repo)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def gpu_state() -> dict:
    import torch

    state = {
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version()
        if torch.backends.cudnn.is_available()
        else None,
        "gpus": [],
        "driver": None,
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            state["gpus"].append(
                {
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
        state["driver"] = _run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        )
    return state


def environment(repo: Path) -> dict:
    import torch

    return {
        "collected_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "packages": {name: _version(name) for name in PACKAGES},
        **gpu_state(),
        "slurm": {var: os.environ[var] for var in SLURM_VARS if var in os.environ},
        "modules": os.environ.get("LOADEDMODULES", "").split(":")
        if os.environ.get("LOADEDMODULES")
        else [],
        "pipeline_git": git_state(repo),
    }
