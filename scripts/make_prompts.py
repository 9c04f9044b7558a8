#!/usr/bin/env python
"""Write one behaviour's prompt set (clean/corrupted tokens, answer, distractor) as parquet."""

import argparse
from pathlib import Path

from circuitflow import config as cf_config
from circuitflow.behaviours import make_prompts
from circuitflow.cli import main
from circuitflow.io import write_parquet
from circuitflow.models import read_model_json


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--config", required=True, help="resolved config JSON or a config YAML file"
    )
    parser.add_argument("--behaviour", required=True, help="behaviour name (a key of behaviours)")
    parser.add_argument("--model-json", required=True, help="the model stage's model.json")
    parser.add_argument("--out", required=True, help="output parquet file")
    args = parser.parse_args()
    config = cf_config.load(args.config)
    model_dir = Path(args.model_json).parent
    if args.behaviour not in config["behaviours"]:
        raise cf_config.ConfigError(f"behaviours: no behaviour named {args.behaviour!r}")
    spec = config["behaviours"][args.behaviour]
    frame = make_prompts(
        args.behaviour, spec, config["seed"], read_model_json(model_dir), Path(model_dir)
    )
    write_parquet(args.out, frame)
    print(f"{args.behaviour}: {len(frame)} prompts -> {args.out}")


if __name__ == "__main__":
    main(run)
