#!/usr/bin/env python
"""Interventions: test attribution's claims by ablating and steering.

`behaviour`: circuits (faithfulness, completeness, random controls), single-head and head-set
ablations, feature ablation and steering for one behaviour, into --out-dir.
`across`: one table (and figure) of single-head effects across behaviours.
"""

import argparse
from pathlib import Path

import pandas as pd

from circuitflow import config as cf_config
from circuitflow.cli import main


def behaviour(args: argparse.Namespace) -> None:
    from circuitflow import attribution as attr
    from circuitflow import interventions as iv
    from circuitflow.models import load_model, load_tokenizer

    config = cf_config.load(args.config)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cfg = iv.InterventionsConfig.from_dict(config.get("interventions"))
    model_dir = Path(args.model_json).parent
    model = load_model(model_dir, config["device"], config["model"]["dtype"])
    saes = attr.load_saes(args.saes, next(model.parameters()).device)
    summary = iv.run_stage(
        model,
        pd.read_parquet(args.prompts),
        args.attribution_dir,
        saes,
        load_tokenizer(model_dir),
        cfg,
        args.behaviour,
        args.out_dir,
        int(config.get("seed", 0)),
    )
    heads = ", ".join(
        f"L{h['layer']}H{h['head']} {h['drop_frac']:.0%}" for h in summary["top_heads"][:3]
    )
    print(
        f"{args.behaviour}: faithfulness {summary['faithfulness']:.3f}, completeness "
        f"{summary['completeness']:.3f} at n={summary['circuit_size']}; smallest faithful n="
        f"{summary['smallest_faithful_size']}; top head drops {heads}"
    )


def across(args: argparse.Namespace) -> None:
    from circuitflow import interventions as iv
    from circuitflow import plots_interventions as plots
    from circuitflow.io import save_figure, write_parquet

    if len(args.behaviours) != len(args.heads):
        raise ValueError("--behaviours and --heads must name the same number of items")
    tables = {b: pd.read_parquet(p) for b, p in zip(args.behaviours, args.heads, strict=True)}
    frame = iv.heads_across_behaviours(tables)
    save_figure(args.out_figure, plots.heads_across(frame))
    write_parquet(args.out, frame)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("behaviour", help="all interventions for one behaviour")
    one.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    one.add_argument("--behaviour", required=True)
    one.add_argument("--prompts", required=True, help="prompts parquet")
    one.add_argument("--model-json", required=True, help="the model stage's model.json")
    one.add_argument(
        "--attribution-dir", required=True, help="attribution/{behaviour} (tables, graph.json)"
    )
    one.add_argument("--saes", nargs="*", default=[], help="SAE directories (SAELens format)")
    one.add_argument("--out-dir", required=True)
    one.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    one.set_defaults(func=behaviour)
    cross = sub.add_parser("across", help="single-head effects across behaviours")
    cross.add_argument("--behaviours", nargs="+", required=True)
    cross.add_argument("--heads", nargs="+", required=True, help="heads.parquet per behaviour")
    cross.add_argument("--out", required=True, help="parquet to write")
    cross.add_argument("--out-figure", required=True, help="PNG to write")
    cross.set_defaults(func=across)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main(run)
