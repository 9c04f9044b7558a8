#!/usr/bin/env python
"""The explainer labeller (rules explain_features_*, when features.labeller names a language
model): the model explains every live feature of each --features folder (the features job's,
features_deterministic/{site}/layer_N) from its top and quantile contexts, its explanations
are scored by detection on the held-out examples, with a control, and each folder is written
again to the matching --out (features/{site}/layer_N) with the label shown chosen among the
three labellers (circuitflow.features.explainer). Resumes from --checkpoint-dir.

Exit status: 0 done; 2 bad config or unusable input; 3 out of memory; 75 stopped by SIGTERM
after checkpointing (rerun to resume)."""

from circuitflow import cli


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config")
    parser.add_argument("--explainer-json", required=True, help="prefetch_explainer's record")
    parser.add_argument(
        "--features", nargs="+", required=True,
        help="the features job's folders, features_deterministic/{site}/layer_N",
    )  # fmt: skip
    parser.add_argument("--out", nargs="+", required=True,
                        help="features/{site}/layer_N of each --features, in order")  # fmt: skip
    parser.add_argument("--checkpoint-dir", help="the job's checkpoint (none: not resumable)")
    args, config = cli.parse(parser)
    from circuitflow.features import explainer

    summaries = explainer.run(config, args.explainer_json, args.features, args.out,
                              args.checkpoint_dir)  # fmt: skip
    for out, s in zip(args.out, explainer.job_summary(summaries), strict=True):
        print(
            f"explainer: {out}: held-out mean F1 {s['explainer_mean_f1']} (control "
            f"{s['control_mean_f1']}); shown: {s['shown']}"
        )


if __name__ == "__main__":
    cli.main(run)
