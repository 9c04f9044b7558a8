#!/usr/bin/env python
"""The report's jobs of a finished run, rerun by two checkouts side by side: wall and CPU seconds
(user + sys of Snakemake and every job it waits for) and their ratio, in alternating rounds.

Issue 56: a job that needs no model should not pay the model libraries' import (torch alone is
about 1.5 CPU-s a job on 2 cores). Each round copies RESULTS (times kept, so nothing upstream
reruns) and runs `snakemake --forcerun <REPORT_RULES> --rerun-triggers mtime` with each
checkout's Snakefile, code and virtual environment, on the config the run was made with.

    python benchmarks/report_jobs.py --before ../old-clone --after . \
        --results /tmp/small/results --config .test/config/small.yaml --rounds 2
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPORT_RULES = (
    "interventions_across", "sae_summary", "report_baseline", "report_behaviour",
    "report_provenance", "report_features_dictionary", "report_features", "report_gpu_hours",
    "job_costs", "provenance_run",
)  # fmt: skip


def rerun(checkout: Path, results: Path, config: dict, work: Path) -> tuple[float, float]:
    """(wall s, CPU s) of rerunning the report rules of a copy of `results` with `checkout`."""
    copy = work / "results"
    shutil.copytree(results, copy)
    cfg = work / "config.yaml"
    cfg.write_text(yaml.safe_dump({**config, "outdir": str(copy)}, sort_keys=False))
    venv = checkout / ".venv" / "bin"
    env = {**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}"}
    cmd = [str(venv / "python"), "-m", "snakemake", "--snakefile", str(checkout / "Snakefile"),
           "--directory", str(checkout), "--configfile", str(cfg), "--cores", "2", "--nolock",
           "--rerun-triggers", "mtime", "--forcerun", *REPORT_RULES]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{checkout}: snakemake failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout with its .venv")
    parser.add_argument("--after", type=Path, required=True, help="a checkout with its .venv")
    parser.add_argument("--results", type=Path, required=True, help="a finished run's results")
    parser.add_argument("--config", type=Path, required=True, help="the config it was run with")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text())
    figures: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name in figures:
            with tempfile.TemporaryDirectory(prefix=f"report-jobs-{name}-") as work:
                checkout = getattr(args, name).resolve()
                figures[name].append(rerun(checkout, args.results.resolve(), config, Path(work)))
                wall, cpu = figures[name][-1]
                print(f"{name}: wall {wall:.1f} s, CPU {cpu:.1f} s", flush=True)
    for i, what in enumerate(("wall", "CPU")):
        a = [f[i] for f in figures["after"]]
        b = [f[i] for f in figures["before"]]
        print(f"{what}: after / before = {min(a) / min(b):.2f} (best of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
