#!/usr/bin/env python
"""Provenance. `environment`: software, GPU, Slurm job and git commit, and the resolved config.
`after-run` (after the stages): hashes of the run's inputs, its Slurm jobs from sacct, pip
freeze, seeds and failed jobs."""

from circuitflow import cli, provenance
from circuitflow.model import same_as


def run() -> None:
    parser = cli.parser(__doc__)
    sub = cli.subcommands(parser)
    p = sub.add_parser("environment", help="environment.json and config.resolved.yaml")
    cli.add_inputs(p, "config")
    cli.add_outputs(p, "environment", "config")
    p = sub.add_parser("after-run", help="hashes, Slurm jobs, pip freeze, seeds, failed jobs")
    cli.add_inputs(p, "config")
    p.add_argument("--outdir", required=True, help="results directory whose inputs are hashed")
    cli.add_outputs(p, "hashes", "slurm", "pip-freeze", "run")
    args, config = cli.parse(parser)
    if args.command == "environment":
        record, _ = same_as.check(config)  # the local model's identity, where the user gave it
        provenance.write_environment(config, args.out_environment, args.out_config, record)
    else:
        provenance.write_after_run(
            config, args.outdir, args.out_hashes, args.out_slurm, args.out_pip_freeze, args.out_run
        )


if __name__ == "__main__":
    cli.main(run)
