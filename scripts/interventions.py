#!/usr/bin/env python
"""Interventions: test attribution's claims by ablating and steering.

`behaviour`: circuits (faithfulness, completeness, random controls), single-head and head-set
ablations, feature ablation and steering for one behaviour, into --out-dir.
`across`: one table (and figure) of single-head effects across behaviours.
"""

import argparse

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.interventions import stage


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("behaviour", help="all interventions for one behaviour")
    one.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    one.add_argument("--behaviour", required=True)
    one.add_argument("--prompts", required=True, help="prompts parquet")
    one.add_argument("--model-json", required=True, help="the model stage's model.json")
    one.add_argument("--attribution-dir", required=True, help="attribution/{behaviour}")
    one.add_argument("--saes", nargs="*", default=[], help="SAE directories (SAELens format)")
    one.add_argument("--out-dir", required=True)
    many = sub.add_parser("across", help="single-head effects across behaviours")
    many.add_argument("--behaviours", nargs="+", required=True)
    many.add_argument("--heads", nargs="+", required=True, help="interventions heads.parquet files")
    many.add_argument("--out", required=True, help="heads_across_behaviours.parquet")
    many.add_argument("--out-figure", required=True)
    args = parser.parse_args()
    if args.command == "across":
        stage.across(args.behaviours, args.heads, args.out, args.out_figure)
        return
    s = stage.run(
        cf_config.load(args.config),
        args.behaviour,
        args.prompts,
        args.model_json,
        args.attribution_dir,
        args.saes,
        args.out_dir,
    )
    print(stage.headline(args.behaviour, s))


if __name__ == "__main__":
    main(run)
