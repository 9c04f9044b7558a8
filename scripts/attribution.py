#!/usr/bin/env python
"""Attribution for one behaviour: which heads, MLPs, SAE features and error terms drive the
logit difference; writes tables, graph.json, figures and feature contexts into --out-dir."""

import argparse
from pathlib import Path

import pandas as pd

from circuitflow import attribution as attr
from circuitflow import attribution_stage
from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.models import load_model, load_tokenizer


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--behaviour", required=True)
    parser.add_argument("--prompts", required=True, help="prompts parquet")
    parser.add_argument("--model-json", required=True, help="the model stage's model.json")
    parser.add_argument("--saes", nargs="*", default=[], help="SAE directories (SAELens format)")
    parser.add_argument(
        "--activations", nargs="*", default=[], help="activation files, same order as --saes"
    )
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    args = parser.parse_args()
    if len(args.saes) != len(args.activations):
        raise ValueError("--saes and --activations must name the same number of paths")
    config = cf_config.load(args.config)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cfg = attr.AttributionConfig.from_dict(config.get("attribution"))
    model_dir = Path(args.model_json).parent
    model = load_model(model_dir, config["device"], config["model"]["dtype"])
    device = next(model.parameters()).device
    saes = attr.load_saes(args.saes, device)
    # Pair SAEs with activation files by hook name, not by argument order alone.
    acts = {}
    for sae_dir, act in zip(args.saes, args.activations, strict=True):
        site, layer = Path(sae_dir).parent.name, int(Path(sae_dir).name.removeprefix("layer_"))
        acts[attr.sae_hook(site, layer)] = Path(act)
    summary = attribution_stage.run(
        model,
        pd.read_parquet(args.prompts),
        saes,
        acts,
        load_tokenizer(model_dir),
        cfg,
        args.behaviour,
        args.out_dir,
    )
    top = ", ".join(f"L{h['layer']}H{h['head']} {h['score']:.2f}" for h in summary["top_heads"])
    print(f"{args.behaviour}: top heads {top}; spearman {summary['validation']['spearman']}")


if __name__ == "__main__":
    main(run)
