#!/usr/bin/env python
"""Record the environment (software, GPU, Slurm job, git commit) and the resolved config."""

import argparse
from pathlib import Path

import yaml

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.io import write_json, write_text
from circuitflow.provenance import environment


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--config", required=True, help="resolved config JSON or a config YAML file"
    )
    parser.add_argument("--out-environment", required=True)
    parser.add_argument("--out-config", required=True)
    args = parser.parse_args()
    config = cf_config.load(args.config)
    write_json(args.out_environment, environment(Path(__file__).resolve().parents[1]))
    write_text(args.out_config, yaml.safe_dump(config, sort_keys=False))


if __name__ == "__main__":
    main(run)
