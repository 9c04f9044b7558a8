#!/usr/bin/env python
"""Use the published dictionaries of a group of sites and layers (rule pretrained_sae, sae.source
pretrained): load the model once, then each member's dictionary (a SAELens release from the
Hugging Face cache, offline, a local directory, or a local copy of a release through its SAELens
conversion), check it fits the run (a transcoder adapted to site mlp_in), write it to its --out
directory in SAELens's format and evaluate it on the run's token set (metrics.json, as train_sae
writes; nothing is trained).

Exit status: 0 done; 2 bad config or unusable input (a dictionary that does not fit the run or
is not in the cache, a directory not in SAELens's format); 3 out of memory."""

import argparse

from circuitflow import cli
from circuitflow.nodes import SITES


def member(text: str) -> tuple[str, int]:
    site, _, layer = text.partition(":")
    if site not in SITES or not layer.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not site:layer (e.g. resid_pre:3; sites: {', '.join(SITES)})"
        )
    return site, int(layer)


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "model-json")
    parser.add_argument(
        "--members", nargs="+", required=True, type=member, help="site:layer of each one"
    )
    parser.add_argument("--tokens-npy", required=True, help="activations/tokens.npy")
    parser.add_argument("--tokens-json", required=True, help="activations/tokens.json")
    parser.add_argument(
        "--out", nargs="+", required=True, help="saes/{site}/layer_N of each member, in order"
    )
    args, config = cli.parse(parser)
    # SAELens's import takes seconds: not for --help
    from circuitflow.sae import lifecycle, pretrained_stage

    results = pretrained_stage.run_group(
        config, args.members, args.model_json, args.tokens_npy,
        args.tokens_json, args.out,
    )  # fmt: skip
    for out, metrics in zip(args.out, results.values(), strict=True):
        print(
            f"pretrained_sae: {out}: {metrics['architecture']} d_sae={metrics['d_sae']} "
            f"{lifecycle.metrics_line(metrics)}"
        )


if __name__ == "__main__":
    cli.main(run)
