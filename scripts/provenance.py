#!/usr/bin/env python
"""Provenance. `environment`: software, GPU, Slurm job and git commit, and the resolved config.
`after-run` (after the stages): hashes of the run's inputs, its Slurm jobs from sacct, pip
freeze, seeds and failed jobs."""

import argparse

from circuitflow import config as cf_config
from circuitflow import provenance
from circuitflow.cli import main


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("environment", help="environment.json and config.resolved.yaml")
    p.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    p.add_argument("--out-environment", required=True)
    p.add_argument("--out-config", required=True)
    p = sub.add_parser("after-run", help="hashes, Slurm jobs, pip freeze, seeds, failed jobs")
    p.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    p.add_argument("--outdir", required=True, help="results directory whose inputs are hashed")
    for name in ("hashes", "slurm", "pip-freeze", "run"):
        p.add_argument(f"--out-{name}", required=True)
    args = parser.parse_args()
    config = cf_config.load(args.config)
    if args.command == "environment":
        provenance.write_environment(config, args.out_environment, args.out_config)
    else:
        provenance.write_after_run(
            config, args.outdir, args.out_hashes, args.out_slurm, args.out_pip_freeze, args.out_run
        )


if __name__ == "__main__":
    main(run)
