#!/usr/bin/env python
"""Train one SAE on one layer's activations (rule train_sae); resumes from --checkpoint-dir.

Exit status: 0 done; 2 bad config or unusable input (incomplete activation file, corrupt
checkpoint); 3 out of memory; 75 stopped by SIGTERM after checkpointing (rerun to resume)."""

import argparse

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.sae import stage


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--activations", required=True, help="activations/{site}/layer_N.h5")
    parser.add_argument("--model-json", required=True, help="the model stage's model.json")
    parser.add_argument("--out", required=True, help="output directory saes/{site}/layer_N")
    parser.add_argument(
        "--checkpoint-dir", help="where checkpoints live (default: OUT.ckpt next to OUT)"
    )
    args = parser.parse_args()
    metrics = stage.run(
        cf_config.load(args.config),
        args.activations,
        args.model_json,
        args.out,
        args.checkpoint_dir,
    )
    print(
        f"train_sae: {args.out}: l0={metrics['l0']:.2f} "
        f"explained_variance={metrics['explained_variance']:.3f} "
        f"ce_loss_recovered={metrics['ce_loss_recovered']} "
        f"dead_fraction={metrics['dead_fraction']:.3f} tokens_per_s={metrics['tokens_per_s']:.0f}"
    )


if __name__ == "__main__":
    main(run)
