#!/usr/bin/env python
"""Write one behaviour's prompt set (clean/corrupted tokens, answer, distractor) as parquet."""

import argparse
from pathlib import Path

from circuitflow import config as cf_config
from circuitflow import prompts
from circuitflow.cli import main


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--behaviour", required=True, help="behaviour name (a key of behaviours)")
    parser.add_argument("--model-json", required=True, help="the model stage's model.json")
    parser.add_argument("--out", required=True, help="output parquet file")
    args = parser.parse_args()
    config = cf_config.load(args.config)
    frame = prompts.run(config, args.behaviour, Path(args.model_json).parent, args.out)
    print(f"{args.behaviour}: {len(frame)} prompts -> {args.out}")


if __name__ == "__main__":
    main(run)
