#!/usr/bin/env python
"""Per-prompt attribution graphs on transcoders (rule prompt_graphs): for
the first attribution.prompt_graphs prompts of a behaviour, the exact replacement graph, pruned
by influence, written as circuit-tracer graph files with graph-metadata.json and summary.json
in --out-dir (attribution/{behaviour}/prompt_graphs), and drawn on one page (--page).

Exit status: 0 done; 2 bad config or unusable input; 3 out of memory."""

from circuitflow import cli


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "behaviour", "prompts", "model-json")
    parser.add_argument("--transcoders", required=True, nargs="+", help="saes/mlp_out/layer_N")
    parser.add_argument(
        "--features",
        nargs="*",
        default=[],
        help="features/mlp_out/layer_N: each feature's label and top contexts",
    )
    parser.add_argument(
        "--features-html", help="report/features.html: the page opens each feature's card beside it"
    )
    parser.add_argument("--out-dir", required=True, help="attribution/{behaviour}/prompt_graphs")
    parser.add_argument("--page", help="the page (default: --out-dir with .html)")
    args, config = cli.parse(parser)
    from circuitflow.attribution.prompt_graphs import stage  # SAELens: not for --help

    s = stage.run(config, args.behaviour, args.prompts, args.model_json, args.transcoders,
                  args.out_dir, args.page, args.features, args.features_html)  # fmt: skip
    print(
        f"prompt_graphs {args.behaviour}: {len(s['graphs'])} graphs, replacement score "
        f"{s['replacement_score_mean']}, completeness {s['completeness_score_mean']}, "
        f"{s['forward_equivalents_per_prompt']:.0f} forward equivalents a graph"
    )


if __name__ == "__main__":
    cli.main(run)
