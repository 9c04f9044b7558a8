#!/usr/bin/env python
"""Cost of every job: wall time, peak memory, CPU time and GPU-hours per rule and per layer from
Snakemake's benchmark files (benchmarks/**.tsv): a CSV per job, an HTML table and a figure."""

import argparse
import json
from pathlib import Path

from circuitflow import config as cf_config
from circuitflow import job_costs
from circuitflow import report_tables as rt
from circuitflow.cli import main
from circuitflow.io import save_figure, write_text


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or YAML file")
    parser.add_argument("--outdir", required=True, help="results directory (holds benchmarks/)")
    parser.add_argument("--environment", required=True, help="provenance/environment.json")
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-html", required=True)
    parser.add_argument("--out-figure", required=True)
    args = parser.parse_args()
    config = cf_config.load(args.config)
    env = json.loads(Path(args.environment).read_text())
    gpu_seen = bool(env.get("cuda_available")) and config.get("device") != "cpu"
    costs = job_costs.job_costs(args.outdir, config, list(config["behaviours"]), gpu_seen)
    write_text(args.out_csv, costs.to_csv(index=False))
    gpus = env.get("gpus") or []
    where = f"{len(gpus)} x {gpus[0]['name']}" if gpus else "no GPU (CPU only)"
    intro = (
        f"From Snakemake's benchmark files (benchmarks/**.tsv) on {env.get('hostname')}, "
        f"{where}. wall_s: wall time; max_rss_mb: peak resident memory of the job's processes; "
        "gpu_hours: wall time x GPUs of jobs that ran on a GPU; gpu_peak_memory_mb: peak GPU "
        "memory the SAE trainer recorded. The report's own jobs are not included."
    )
    sections = [
        ("Per rule", rt.table_html(job_costs.per_rule(costs))),
        ("Per job (rule, behaviour, site and layer)", rt.table_html(costs)),
    ]
    write_text(args.out_html, rt.page("Cost of every job", sections, intro))
    save_figure(args.out_figure, job_costs.plot(costs))


if __name__ == "__main__":
    main(run)
