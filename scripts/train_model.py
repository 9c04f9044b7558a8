#!/usr/bin/env python
"""Train the embedded default model (weights, tokenizer, model.json) into OUT_DIR."""

import argparse
from pathlib import Path

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.embedded_model import EmbeddedModelConfig, train


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--config",
        required=True,
        help="resolved config as JSON (what the rule passes) or a config YAML file",
    )
    parser.add_argument("--out", required=True, help="model.json to write (weights go beside it)")
    args = parser.parse_args()
    info = train(
        EmbeddedModelConfig.from_config(cf_config.load(args.config)), Path(args.out).parent
    )
    print(
        f"trained embedded model: eval loss {info['eval_loss']:.4f}, "
        f"{info['wall_time_s']:.1f} s, {info['tokens_per_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    main(run)
