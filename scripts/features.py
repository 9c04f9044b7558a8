#!/usr/bin/env python
"""Feature interpretation of a group of dictionaries (rules features_*): one streamed pass of the
model over features.n_tokens tokens of the token set; per feature its density, activation
histogram, top and quantile-sampled contexts, promoted and suppressed tokens and a label, each
labeller's labels scored on the held-out contexts (--held-out-npy), written to
features/{site}/layer_{layer}/ (one --out per --saes, in order). Resumes from --checkpoint-dir.

Exit status: 0 done; 2 bad config or unusable input; 3 out of memory; 75 stopped by SIGTERM
after checkpointing (rerun to resume)."""

from circuitflow import cli


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "model-json", "saes")
    parser.add_argument("--tokens-npy", required=True, help="activations/tokens.npy")
    parser.add_argument("--tokens-json", required=True, help="activations/tokens.json")
    parser.add_argument("--held-out-npy", required=True, help="activations/held_out_tokens.npy")
    parser.add_argument("--held-out-json", required=True, help="activations/held_out_tokens.json")
    parser.add_argument(
        "--out", nargs="+", required=True, help="features/{site}/layer_N of each --saes, in order"
    )
    parser.add_argument("--checkpoint-dir", help="the job's checkpoint (none: not resumable)")
    args, config = cli.parse(parser)
    from circuitflow.features import stage  # SAELens's import takes seconds: not for --help

    summaries = stage.run(config, args.model_json, args.tokens_npy, args.tokens_json, args.saes,
                          args.out, (args.held_out_npy, args.held_out_json),
                          args.checkpoint_dir)  # fmt: skip
    for out, s in zip(args.out, summaries, strict=True):
        labels = s["labels"]
        scored = ", ".join(
            f"{name} {b['mean_f1']:.3f} (control {b['control']['mean_f1']:.3f})"
            for name, b in labels["labellers"].items()
            if b["mean_f1"] is not None and b["control"]["mean_f1"] is not None
        )
        print(
            f"features: {out}: {s['n_features']} features over {s['n_tokens']} tokens "
            f"({s['contexts_held_out']} held-out contexts), dead {s['dead_fraction']:.3f}, "
            f"dense {s['dense_fraction']:.3f}; labels ({labels['shown']} shown) held-out mean "
            f"F1 over {labels['held_out_tokens']} tokens: {scored}"
        )


if __name__ == "__main__":
    cli.main(run)
