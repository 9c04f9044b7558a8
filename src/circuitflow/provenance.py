"""What produced a result: software, hardware, job and code versions."""

from __future__ import annotations

import os
import platform
import re
import shutil
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
    # git's processes first, forked before torch is imported: a fork of a process holding torch
    # is counted twice by the job's sampled max_rss for a moment (551 MB against 280 measured).
    git = git_state(repo)
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
        "pipeline_git": git,
    }


# ---- After the stages: hashes of inputs, Slurm accounting, pip freeze, seeds, failures -------

HASH_KINDS = {
    # kind: glob patterns under the results directory
    "model_weights": ("model/*.safetensors", "model/*.bin", "model/model.json"),
    "prompt_sets": ("prompts/*.parquet",),
    "token_sets": ("activations/tokens.npy", "activations/tokens.json"),
    "activations": ("activations/*/layer_*.h5",),
    "sae_weights": ("saes/*/layer_*/sae_weights.safetensors",),
}
SACCT_FIELDS = (
    "JobID",
    "JobName",
    "Comment",
    "State",
    "ExitCode",
    "Elapsed",
    "Start",
    "End",
    "Partition",
    "AllocTRES",
    "NodeList",
    "MaxRSS",
    "WorkDir",
)


def input_hashes(outdir: Path | str) -> dict:
    """sha256 of model weights, prompt sets, token sets, activation files and SAE weights, keyed
    by path relative to `outdir`, plus the content hashes the stages recorded themselves."""
    import json

    from circuitflow.io import sha256_file

    root = Path(outdir)
    files: dict[str, dict[str, str]] = {}
    for kind, patterns in HASH_KINDS.items():
        paths = sorted({p for pattern in patterns for p in root.glob(pattern) if p.is_file()})
        files[kind] = {str(p.relative_to(root)): sha256_file(p) for p in paths}
    content: dict[str, str] = {}
    model_json = root / "model" / "model.json"
    if model_json.exists():
        content["model weights_sha256 (model.json)"] = json.loads(model_json.read_text()).get(
            "weights_sha256"
        )
    tokens_json = root / "activations" / "tokens.json"
    if tokens_json.exists():
        content["token_set_hash (tokens.json)"] = json.loads(tokens_json.read_text()).get(
            "token_set_hash"
        )
    for path in sorted(root.glob("baseline/*.json")):
        content[f"prompts_sha256 ({path.stem})"] = json.loads(path.read_text()).get(
            "prompts_sha256"
        )
    return {"algorithm": "sha256", "files": files, "content_hashes": content}


def parse_sacct(text: str) -> list[dict]:
    """Rows of `sacct --parsable2 --noheader --format=<SACCT_FIELDS>` as dicts."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        rows.append(dict(zip((f.lower() for f in SACCT_FIELDS), values, strict=False)))
    return rows


def slurm_jobs(workdir: Path | str, since: datetime | None) -> dict:
    """This pipeline's Slurm jobs from `sacct` (those submitted from `workdir` since `since`),
    with states and elapsed times, when this job runs under Slurm; else an empty list and the
    reason (a local run, or no accounting)."""
    if not os.environ.get("SLURM_JOB_ID"):
        # A local run (other pipelines' jobs from the same directory must not be listed).
        return {"source": None, "jobs": [], "reason": "not run on Slurm (local execution)"}
    if shutil.which("sacct") is None:
        return {"source": None, "jobs": [], "reason": "not on Slurm: no sacct on this machine"}
    cmd = [
        "sacct",
        "--allocations",
        "--parsable2",
        "--noheader",
        f"--format={','.join(SACCT_FIELDS)}",
    ]
    if since is not None:
        cmd.append(f"--starttime={since.strftime('%Y-%m-%dT%H:%M:%S')}")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"source": "sacct", "jobs": [], "reason": f"sacct failed: {err}"}
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1:] or ["no message"]
        return {"source": "sacct", "jobs": [], "reason": f"sacct failed: {reason[0]}"}
    workdir = str(Path(workdir).resolve())
    # Snakemake's Slurm plugin names jobs by the run's UUID and, where the cluster stores
    # comments, puts `rule_<rule>_wildcards_<...>` in the comment.
    jobs = []
    for row in parse_sacct(done.stdout):
        if row.get("workdir", "").rstrip("/") != workdir:
            continue
        comment = row.get("comment", "")
        row["rule"] = comment[5:].split("_wildcards_")[0] if comment.startswith("rule_") else ""
        jobs.append(row)
    reason = "" if jobs else f"sacct lists no circuitflow jobs from {workdir} since {since}"
    return {"source": "sacct", "command": " ".join(cmd), "jobs": jobs, "reason": reason}


def failed_jobs(
    snakemake_logs: Path | str, outdir: Path | str, since: datetime | None, slurm: dict
) -> list[dict]:
    """Failed jobs and reasons: `Error in rule X` blocks of Snakemake's own logs (written since
    `since`) whose outputs lie under `outdir`, and this run's Slurm jobs that did not complete."""
    import re

    failed = []
    log_dir = Path(snakemake_logs)
    cutoff = since.timestamp() if since else 0
    prefixes = tuple({str(outdir).rstrip("/") + "/", str(Path(outdir).resolve()) + "/"})
    for path in sorted(log_dir.glob("*.snakemake.log")) if log_dir.is_dir() else []:
        if path.stat().st_mtime < cutoff:
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"Error in rule (\S+?):\n((?:    .*\n)+)", text):
            fields = dict(re.findall(r"^ {4}(\w[\w ]*?):\s*(.*)$", match.group(2), flags=re.M))
            outputs = [o.strip() for o in fields.get("output", "").split(",") if o.strip()]
            mine = [o for o in outputs if o.startswith(prefixes)]
            if not mine:
                continue
            reasons = [fields.get(k) for k in ("message", "exit code")]
            reason = next((r for r in reasons if r and r != "None"), "command exited non-zero")
            failed.append(
                {
                    "source": f".snakemake/log/{path.name}",
                    "rule": match.group(1),
                    "output": mine[0],
                    "reason": reason,
                    "log": fields.get("log", "").replace(
                        " (check log file(s) for error details)", ""
                    ),
                }
            )
    for job in slurm.get("jobs", []):
        if job.get("state", "").split()[0] not in ("COMPLETED", "RUNNING", "PENDING"):
            failed.append(
                {
                    "source": "sacct",
                    "rule": job.get("rule") or job.get("jobname", ""),
                    "output": f"Slurm job {job.get('jobid', '')}",
                    "reason": f"{job.get('state')} (exit {job.get('exitcode')})",
                    "log": "",
                }
            )
    return failed


# What provenance_run holds beyond circuitflow.config's runtime: the script's own modules and
# every installed distribution's metadata (the job's peak, 25.6 MiB on the default run, less 16).
FREEZE_BYTES = 10 * 2**20


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of a provenance_run job's work (resources' rule table): the distributions'
    metadata; the hashes stream their files."""
    return FREEZE_BYTES


def job_work(config: dict, rule: str, behaviour: str | None = None) -> None:
    """No counted work: hashes, accounting and the installed distributions."""
    return None


def pip_freeze() -> str:
    """This interpreter's installed distributions in `pip freeze --all`'s requirement format,
    read in this process from the metadata pip itself reads (PEP 610's direct_url.json for
    URL, VCS and editable installs). Not `python -m pip freeze` in a child: its 37 MiB lived
    half a second, so the benchmark's sampler caught or missed it and the job's peak could not
    be planned (tests/test_memory_accuracy.py)."""
    import json

    lines: dict[str, str] = {}
    # sys.path order, but installed records (pip writes INSTALLER) before metadata lying in a
    # source tree: a job's PYTHONPATH puts src/ first, and an editable install leaves
    # src/circuitflow.egg-info there, which would turn `-e <path>` into `circuitflow==0.1.0`.
    dists = sorted(metadata.distributions(), key=lambda d: d.read_text("INSTALLER") is None)
    for dist in dists:
        name = dist.metadata["Name"]
        key = re.sub(r"[-_.]+", "-", name).lower() if name else None  # PEP 503's normal form
        if key is None or key in lines:
            continue
        direct = json.loads(dist.read_text("direct_url.json") or "null") or {}
        url, vcs = direct.get("url"), direct.get("vcs_info")
        editable = direct.get("dir_info", {}).get("editable", False)
        if vcs:
            ref = f"{vcs['vcs']}+{url}@{vcs['commit_id']}"
            lines[key] = f"-e {ref}#egg={name}" if editable else f"{name} @ {ref}"
        elif editable:  # its path; pip asks git for a clone's remote (environment.json: commit)
            lines[key] = f"-e {url.removeprefix('file://')}"
        elif url:
            lines[key] = f"{name} @ {url}"
        else:
            lines[key] = f"{name}=={dist.version}"
    return "\n".join(lines[k] for k in sorted(lines)) + "\n"


def seeds(config: dict) -> dict:
    """Every seed in the resolved config (the master `seed`, and any per-stage `seed` keys)."""
    found: dict = {}

    def walk(node, prefix=""):
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{prefix}.{key}" if prefix else key
                if "seed" in key.lower() and not isinstance(value, dict):
                    found[path] = value
                walk(value, path)

    walk(config)
    return found


def run_started(outdir: Path | str) -> datetime | None:
    """When this run's first job started: the earliest benchmark file's time minus its wall
    time (a benchmark is written when its job ends), else the oldest stage log; a minute early."""
    import csv

    starts = []
    for path in Path(outdir, "benchmarks").rglob("*.tsv"):
        try:
            with open(path) as handle:
                rows = list(csv.DictReader(handle, delimiter="\t"))
            starts.append(path.stat().st_mtime - float(rows[-1]["s"]))
        except (OSError, KeyError, IndexError, ValueError):
            continue
    if not starts:
        starts = [p.stat().st_mtime for p in Path(outdir, "logs").rglob("*") if p.is_file()]
    if not starts:
        return None
    return datetime.fromtimestamp(min(starts) - 60)


# ---- The stage -------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]


def write_environment(config: dict, out_environment, out_config,
                      model_same_as: dict | None = None) -> None:  # fmt: skip
    """Rule provenance: the environment (software, GPU, job, git) and the resolved config;
    `model_same_as`: model.same_as's check (circuitflow.model.same_as), where it is set."""
    import yaml

    from circuitflow.io import write_json, write_text

    env = environment(REPO)
    if model_same_as is not None:
        env["model_same_as"] = model_same_as
    write_json(out_environment, env)
    write_text(out_config, yaml.safe_dump(config, sort_keys=False))


def write_after_run(config: dict, outdir, out_hashes, out_slurm, out_pip_freeze, out_run) -> None:
    """Rule provenance_run, after the stages: input hashes, this run's Slurm jobs, pip freeze,
    seeds and failed jobs."""
    from circuitflow.io import write_json, write_text

    since = run_started(outdir)
    slurm = slurm_jobs(Path.cwd(), since)
    write_json(out_hashes, input_hashes(outdir))
    write_json(out_slurm, slurm)
    write_text(out_pip_freeze, pip_freeze())
    failed = failed_jobs(Path.cwd() / ".snakemake" / "log", outdir, since, slurm)
    write_json(
        out_run,
        {
            "seeds": seeds(config),
            "failed_jobs": failed,
            "run_started_after": since.isoformat() if since else None,
        },
    )
