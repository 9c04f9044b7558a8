#!/usr/bin/env python
"""Score a behaviour's prompts on the unmodified model: summary JSON, per-prompt parquet and a
logit-difference / calibration figure."""

import argparse

from circuitflow import baseline
from circuitflow import config as cf_config
from circuitflow.cli import main


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--behaviour", required=True)
    parser.add_argument("--prompts", required=True, help="prompts parquet")
    parser.add_argument("--model-json", required=True, help="the model stage's model.json")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-parquet", required=True)
    parser.add_argument("--out-figure", required=True)
    args = parser.parse_args()
    summary = baseline.run(
        cf_config.load(args.config),
        args.behaviour,
        args.prompts,
        args.model_json,
        args.out_json,
        args.out_parquet,
        args.out_figure,
    )
    print(
        f"{args.behaviour}: logit_diff_mean {summary['logit_diff_mean']:.3f}, "
        f"accuracy {summary['accuracy']:.3f} over {summary['n_prompts']} prompts"
    )


if __name__ == "__main__":
    main(run)
