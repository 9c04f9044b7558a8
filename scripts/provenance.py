#!/usr/bin/env python
"""Record the environment (software, GPU, Slurm job, git commit) and the resolved config; after
the stages (--outdir), the hashes of the run's inputs, its Slurm jobs from sacct, pip freeze,
seeds and failed jobs."""

import argparse
from pathlib import Path

import yaml

from circuitflow import config as cf_config
from circuitflow import provenance
from circuitflow.cli import main
from circuitflow.io import write_json, write_text

REPO = Path(__file__).resolve().parents[1]


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--config", required=True, help="resolved config JSON or a config YAML file"
    )
    parser.add_argument("--out-environment", help="environment.json")
    parser.add_argument("--out-config", help="config.resolved.yaml")
    parser.add_argument("--outdir", help="results directory whose inputs are hashed")
    parser.add_argument("--out-hashes", help="hashes.json (needs --outdir)")
    parser.add_argument("--out-slurm", help="slurm_jobs.json (needs --outdir)")
    parser.add_argument("--out-pip-freeze", help="pip_freeze.txt")
    parser.add_argument("--out-run", help="run.json: seeds and failed jobs (needs --outdir)")
    args = parser.parse_args()
    config = cf_config.load(args.config)
    if args.out_environment:
        write_json(args.out_environment, provenance.environment(REPO))
    if args.out_config:
        write_text(args.out_config, yaml.safe_dump(config, sort_keys=False))
    if args.out_pip_freeze:
        write_text(args.out_pip_freeze, provenance.pip_freeze())
    if not (args.out_hashes or args.out_slurm or args.out_run):
        return
    if not args.outdir:
        raise ValueError("--out-hashes, --out-slurm and --out-run need --outdir")
    since = provenance.run_started(args.outdir)
    slurm = provenance.slurm_jobs(Path.cwd(), since)
    if args.out_hashes:
        write_json(args.out_hashes, provenance.input_hashes(args.outdir))
    if args.out_slurm:
        write_json(args.out_slurm, slurm)
    if args.out_run:
        failed = provenance.failed_jobs(
            Path.cwd() / ".snakemake" / "log", args.outdir, since, slurm
        )
        write_json(
            args.out_run,
            {
                "seeds": provenance.seeds(config),
                "failed_jobs": failed,
                "run_started_after": since.isoformat() if since else None,
            },
        )


if __name__ == "__main__":
    main(run)
