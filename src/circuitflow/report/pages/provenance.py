"""The provenance page: the reproducibility checklist from provenance/*.json|yaml|txt."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from circuitflow.report import inputs
from circuitflow.report.html import kv_table, note, table_html

# What the page shows of each provenance file (circuitflow/provenance.py writes them all).
ENVIRONMENT_KEYS = (
    "pipeline_git", "python", "torch", "cuda_version", "cudnn_version", "driver", "gpus",
    "hostname", "platform", "modules", "slurm", "collected_at", "packages",
)  # fmt: skip
RUN_KEYS = ("seeds", "failed_jobs")
HASHES_KEYS = ("files", "content_hashes")
SLURM_KEYS = ("jobs", "reason")


def provenance_sections(prov_dir: Path | str) -> list[tuple[str, str]]:
    """The reproducibility checklist from provenance/*.json|yaml|txt."""
    prov = Path(prov_dir)
    env = inputs.json_of(prov / "environment.json", ENVIRONMENT_KEYS, "provenance", "environment")
    # provenance_run writes run.json after the stages; the page is whole without it.
    run = inputs.optional_json_of(prov / "run.json", RUN_KEYS, "provenance_run", "run record")
    run = run or {}
    hashes = inputs.json_of(prov / "hashes.json", HASHES_KEYS, "provenance_run", "input hashes")
    slurm = inputs.json_of(prov / "slurm_jobs.json", SLURM_KEYS, "provenance_run", "Slurm jobs")
    git = env.get("pipeline_git") or {}
    gpus = env.get("gpus") or []
    check = [
        ("pipeline git commit", git.get("commit")),
        ("uncommitted changes (dirty)", git.get("dirty")),
        ("seeds", json.dumps(run.get("seeds", {}))),
        ("python", env.get("python")),
        ("torch", env.get("torch")),
        ("CUDA / cuDNN", f"{env.get('cuda_version')} / {env.get('cudnn_version')}"),
        ("GPU driver", env.get("driver")),
        ("GPUs", f"{len(gpus)} x {gpus[0]['name']} ({gpus[0]['memory_gib']} GiB)" if gpus
         else "none (CPU)"),
        ("hostname / platform", f"{env.get('hostname')} / {env.get('platform')}"),
        ("loaded modules", env.get("modules") or "none"),
        ("Slurm job variables (provenance job)", json.dumps(env.get("slurm") or {})),
        ("collected at", env.get("collected_at")),
    ]  # fmt: skip
    sections = [("Reproducibility checklist", kv_table(check))]
    packages = env.get("packages") or {}
    sections.append(("Key package versions", kv_table(sorted(packages.items()))))
    hash_rows = [
        {"kind": kind, "path": path, "sha256": digest}
        for kind, entries in hashes.get("files", {}).items()
        for path, digest in entries.items()
    ]
    extra = "".join(
        f"<li>{html.escape(k)}: <code>{html.escape(str(v))}</code></li>"
        for k, v in hashes.get("content_hashes", {}).items()
    )
    sections.append(
        (
            "Hashes of inputs (provenance/hashes.json)",
            (f"<ul>{extra}</ul>" if extra else "") + table_html(pd.DataFrame(hash_rows)),
        )
    )
    jobs = pd.DataFrame(slurm.get("jobs") or [])
    body = note(html.escape(slurm.get("reason") or ""))
    if not jobs.empty:
        body += table_html(jobs)
    sections.append(("Slurm jobs (provenance/slurm_jobs.json)", body))
    failed = run.get("failed_jobs") or []
    fail_body = (
        table_html(pd.DataFrame(failed))
        if failed
        else note("no failed jobs recorded (Snakemake logs in .snakemake/log" +
                  (" and sacct" if slurm.get("jobs") else "") + ")")
    )  # fmt: skip
    sections.append(("Failed jobs and reasons", fail_body))
    # Files of this run's own provenance rule, read as text where present.
    config_file = prov / "config.resolved.yaml"
    if config_file.exists():
        sections.append(("Resolved config", f"<pre>{html.escape(config_file.read_text())}</pre>"))
    freeze = prov / "pip_freeze.txt"
    if freeze.exists():
        sections.append(("pip freeze", f"<pre>{html.escape(freeze.read_text())}</pre>"))
    return sections
