#!/usr/bin/env python
"""Train the embedded default model (weights, tokenizer, model.json) beside --out."""

import argparse
from pathlib import Path

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.model.embedded import EmbeddedModelConfig, train


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--out", required=True, help="model.json to write (weights go beside it)")
    args = parser.parse_args()
    cfg = EmbeddedModelConfig.from_config(cf_config.load(args.config))
    info = train(cfg, Path(args.out).parent)
    print(
        f"trained embedded model: eval loss {info['eval_loss']:.4f}, "
        f"{info['wall_time_s']:.1f} s, {info['tokens_per_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    main(run)
