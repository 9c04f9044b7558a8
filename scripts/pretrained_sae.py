#!/usr/bin/env python
"""Use a published dictionary for one site and layer (rule pretrained_sae, sae.source
pretrained): load it (a SAELens release from the Hugging Face cache, offline, or a local
directory), check it fits the run, write it to --out in SAELens's format and evaluate it on the
run's token set (metrics.json, as train_sae writes; nothing is trained).

Exit status: 0 done; 2 bad config or unusable input (a dictionary that does not fit the run or
is not in the cache, a directory not in SAELens's format); 3 out of memory."""

from circuitflow import cli
from circuitflow.nodes import SITES
from circuitflow.sae import pretrained_stage


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "model-json")
    parser.add_argument("--site", required=True, choices=SITES, help="hook site")
    parser.add_argument("--layer", required=True, type=int, help="layer index")
    parser.add_argument("--tokens-npy", required=True, help="activations/tokens.npy")
    parser.add_argument("--tokens-json", required=True, help="activations/tokens.json")
    parser.add_argument("--out", required=True, help="output directory saes/{site}/layer_N")
    args, config = cli.parse(parser)
    metrics = pretrained_stage.run(
        config, args.site, args.layer, args.model_json, args.tokens_npy, args.tokens_json,
        args.out,
    )  # fmt: skip
    print(
        f"pretrained_sae: {args.out}: {metrics['architecture']} d_sae={metrics['d_sae']} "
        f"l0={metrics['l0']:.2f} explained_variance={metrics['explained_variance']:.3f} "
        f"ce_loss_recovered={metrics['ce_loss_recovered']} "
        f"dead_fraction={metrics['dead_fraction']:.3f}"
    )


if __name__ == "__main__":
    cli.main(run)
