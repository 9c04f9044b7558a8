#!/usr/bin/env python
"""Train one SAE on one layer's activations, or one transcoder on a layer's MLP input and output
(rule train_sae); resumes from --checkpoint-dir.

Exit status: 0 done; 2 bad config or unusable input (incomplete activation file, corrupt
checkpoint); 3 out of memory; 75 stopped by SIGTERM after checkpointing (rerun to resume)."""

from circuitflow import cli


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config")
    parser.add_argument(
        "--activations",
        required=True,
        nargs="+",
        help="activations/{site}/layer_N.h5; a transcoder: activations/mlp_in/layer_N.h5 and "
        "activations/mlp_out/layer_N.h5",
    )
    cli.add_inputs(parser, "model-json")
    parser.add_argument("--out", required=True, help="output directory saes/{site}/layer_N")
    parser.add_argument(
        "--checkpoint-dir", help="where checkpoints live (default: OUT.ckpt next to OUT)"
    )
    args, config = cli.parse(parser)
    from circuitflow.sae.config import SAETrainConfig
    from circuitflow.sae.inputs import Inputs

    # A bad sae key, then unusable files: the stage's own check, before SAELens's import
    # (~5 s of CPU).
    Inputs.read(SAETrainConfig.from_config(config), args.activations)
    from circuitflow.sae import lifecycle, stage  # SAELens's import takes seconds: not for --help

    metrics = stage.run(config, args.activations, args.model_json, args.out, args.checkpoint_dir)
    print(
        f"train_sae: {args.out}: {lifecycle.metrics_line(metrics)} "
        f"tokens_per_s={metrics['tokens_per_s']:.0f}"
    )


if __name__ == "__main__":
    cli.main(run)
