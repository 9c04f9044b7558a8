#!/usr/bin/env python
"""Train the SAEs of a group of sites and layers from the model's own activations, one stream of
forward passes for all of them (rule train_sae_stream, sae.source: stream); no activation file
is read or written. Resumes from --checkpoint-dir.

Exit status: 0 done; 2 bad config or unusable input (token set, corrupt checkpoint); 3 out of
memory; 75 stopped by SIGTERM after checkpointing (rerun to resume)."""

from circuitflow import cli


def member(text: str) -> tuple[str, int]:
    site, _, layer = text.partition(":")
    if not layer.isdigit():
        raise ValueError(f"--members: {text!r} is not site:layer (e.g. resid_post:3)")
    return site, int(layer)


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "model-json")
    parser.add_argument("--tokens-npy", required=True, help="activations/tokens.npy")
    parser.add_argument("--tokens-json", required=True, help="activations/tokens.json")
    parser.add_argument("--members", nargs="+", required=True, help="site:layer of each SAE")
    parser.add_argument(
        "--out", nargs="+", required=True, help="saes/{site}/layer_N of each member, in order"
    )
    parser.add_argument("--checkpoint-dir", required=True, help="the group's checkpoints")
    args, config = cli.parse(parser)
    # SAELens's import takes seconds: not for --help
    from circuitflow.sae import lifecycle, stream_stage

    members = [member(m) for m in args.members]
    results = stream_stage.run(
        config,
        args.model_json,
        args.tokens_npy,
        args.tokens_json,
        members,
        args.out,
        args.checkpoint_dir,
    )
    for out, m in zip(args.out, results.values(), strict=True):
        print(f"train_sae_stream: {out}: {lifecycle.metrics_line(m)}")
    first = next(iter(results.values()))
    print(
        f"train_sae_stream: {len(results)} SAEs, {first['tokens_trained']} tokens each from "
        f"{first['stream']['forward_equivalents']:.0f} counted forward equivalents "
        f"({first['stream']['forward_equivalents_per_context']:.3f} a context), "
        f"{first['tokens_per_s']:.0f} tokens/s, 0 activation bytes written"
    )


if __name__ == "__main__":
    cli.main(run)
