#!/usr/bin/env python
"""Train the embedded default model (weights, tokenizer, model.json) beside --out."""

from pathlib import Path

from circuitflow import cli
from circuitflow.model.embedded import EmbeddedModelConfig, train


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config")
    parser.add_argument("--out", required=True, help="model.json to write (weights go beside it)")
    args, config = cli.parse(parser)
    cfg = EmbeddedModelConfig.from_config(config)
    info = train(cfg, Path(args.out).parent)
    print(
        f"trained embedded model: eval loss {info['eval_loss']:.4f}, "
        f"{info['wall_time_s']:.1f} s, {info['tokens_per_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    cli.main(run)
