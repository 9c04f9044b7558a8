#!/usr/bin/env python
"""The replacement model's loss (rule transcoder_replacement): the model
with every MLP replaced by its transcoder at once, on the held-out contexts of the train_sae
jobs (or the streamed ones' held-out token-set contexts); writes saes/replacement.json.

Exit status: 0 done; 2 bad config or unusable input; 3 out of memory."""

from circuitflow import cli


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "model-json")
    parser.add_argument("--transcoders", required=True, nargs="+", help="saes/mlp_out/layer_N")
    held_out = parser.add_mutually_exclusive_group(required=True)
    held_out.add_argument(
        "--activations", help="an activations/mlp_in/layer_N.h5 (sae.source capture)"
    )
    held_out.add_argument(
        "--tokens", nargs=2, help="activations/tokens.npy and tokens.json (sae.source stream)"
    )
    parser.add_argument("--out", required=True, help="saes/replacement.json")
    args, config = cli.parse(parser)
    from circuitflow.sae import replacement  # SAELens's import takes seconds: not for --help

    m = replacement.run(config, args.transcoders, args.model_json, args.out, args.activations,
                        args.tokens)  # fmt: skip
    print(
        f"transcoder_replacement: {len(args.transcoders)} MLPs replaced: ce_clean="
        f"{m['ce_clean']:.4f} ce_sae={m['ce_sae']:.4f} ce_zero={m['ce_zero']:.4f} "
        f"ce_loss_recovered={m['ce_loss_recovered']}"
    )


if __name__ == "__main__":
    cli.main(run)
