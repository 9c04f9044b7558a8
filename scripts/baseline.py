#!/usr/bin/env python
"""Score a behaviour's prompts on the unmodified model: summary JSON, per-prompt parquet and a
logit-difference / calibration figure."""

import argparse
from pathlib import Path

import pandas as pd

from circuitflow import baseline
from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.io import save_figure, write_json, write_parquet
from circuitflow.models import load_model, read_model_json


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--config", required=True, help="resolved config JSON or a config YAML file"
    )
    parser.add_argument("--behaviour", required=True)
    parser.add_argument("--prompts", required=True, help="prompts parquet")
    parser.add_argument("--model-json", required=True, help="the model stage's model.json")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-parquet", required=True)
    parser.add_argument("--out-figure", required=True)
    args = parser.parse_args()
    config = cf_config.load(args.config)
    model_dir = Path(args.model_json).parent
    model = load_model(model_dir, config["device"], config["model"]["dtype"])
    prompts = pd.read_parquet(args.prompts)
    opts = config["baseline"]
    summary, scores, table = baseline.run(
        model, prompts, opts["batch_size"], opts["calibration_bins"]
    )
    summary |= {
        "behaviour": args.behaviour,
        "model_weights_sha256": read_model_json(model_dir)["weights_sha256"],
    }
    save_figure(args.out_figure, baseline.plot(scores, table, f"{args.behaviour} baseline"))
    write_parquet(args.out_parquet, scores)
    write_json(args.out_json, summary | {"calibration": baseline.json_records(table)})
    print(
        f"{args.behaviour}: logit_diff_mean {summary['logit_diff_mean']:.3f}, "
        f"accuracy {summary['accuracy']:.3f} over {summary['n_prompts']} prompts"
    )


if __name__ == "__main__":
    main(run)
