#!/usr/bin/env python
"""Attribution for one behaviour: which heads, MLPs, SAE features and error terms drive the
logit difference; writes tables, graph.json, figures and feature contexts into --out-dir."""

import argparse

from circuitflow import config as cf_config
from circuitflow.attribution import stage
from circuitflow.cli import main


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--behaviour", required=True)
    parser.add_argument("--prompts", required=True, help="prompts parquet")
    parser.add_argument("--model-json", required=True, help="the model stage's model.json")
    parser.add_argument("--saes", nargs="*", default=[], help="SAE directories (SAELens format)")
    parser.add_argument("--activations", nargs="*", default=[], help="their activation files")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    summary = stage.run(
        cf_config.load(args.config),
        args.behaviour,
        args.prompts,
        args.model_json,
        args.saes,
        args.activations,
        args.out_dir,
    )
    print(stage.headline(summary))


if __name__ == "__main__":
    main(run)
