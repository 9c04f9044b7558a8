#!/usr/bin/env python
"""The report's pages (rules in report.smk), one subcommand each: `sae` (SAE metrics per layer
and the L0 controller), `baseline` (every behaviour's baseline metrics), `behaviour` (top
attribution nodes, faithfulness and completeness with controls, head ablations; and the
attribution graph's page with the steering results), `provenance`
(the reproducibility checklist), `gpu_hours` (GPU-hours of a full run from the GPU benchmark
suite's results), `job_costs` (wall time, memory and GPU-hours of every job), `features` (a
dictionary's page of the feature browser) and `features_index` (the browser's index of every
dictionary). HTML pages for the report, CSVs beside them."""

from circuitflow import cli
from circuitflow.report import features_page, stage


def run() -> None:
    parser = cli.parser(__doc__)
    sub = cli.subcommands(parser)
    p = sub.add_parser("sae", help="SAE metrics per layer")
    p.add_argument("--saes", nargs="+", required=True, help="SAE directories")
    p.add_argument(
        "--features-dirs",
        nargs="*",
        default=[],
        help="their features/{site}/layer_{layer}/ folders (dead and dense fractions)",
    )
    cli.add_outputs(p, "csv", "html", "figure", "controller")
    p = sub.add_parser("baseline", help="baseline metrics of every behaviour")
    p.add_argument("--json", nargs="+", required=True, help="baseline/{behaviour}.json files")
    cli.add_outputs(p, "csv", "html")
    p = sub.add_parser("behaviour", help="attribution and interventions tables of a behaviour")
    cli.add_inputs(p, "behaviour", "attribution-dir")
    p.add_argument("--interventions-dir", required=True, help="interventions/{behaviour}")
    p.add_argument(
        "--prompt-graphs", default=None, help="attribution/{behaviour}/prompt_graphs (transcoders)"
    )
    p.add_argument(
        "--features-dirs", nargs="*", default=[], help="features/{site}/layer_{layer}: labels"
    )
    p.add_argument(
        "--features-html",
        default=None,
        help="report/features.html: the graph page links each feature to its card beside it",
    )
    p.add_argument("--top", type=int, default=15, help="rows per table")
    cli.add_outputs(p, "html")
    p.add_argument("--out-graph", help="the attribution graph page with steering results")
    p = sub.add_parser("provenance", help="the reproducibility checklist")
    p.add_argument("--provenance-dir", required=True)
    cli.add_outputs(p, "html")
    p = sub.add_parser("gpu_hours", help="GPU-hours of a full run from GPU suite results")
    p.add_argument("--suite", nargs="*", default=[], help="benchmarks/results/*.json")
    cli.add_inputs(p, "config", config="this run's resolved config (JSON or YAML)")
    p.add_argument("--reference-config", required=True, help="e.g. config/qwen2.5-0.5b.yaml")
    p.add_argument("--gpu", default="A100", help="GPU the hours are for (the profile's gpu_type)")
    p.add_argument(
        "--max-runtime",
        type=int,
        default=0,
        help="the profile's walltime cap in minutes (0: none): it splits streaming jobs",
    )
    cli.add_outputs(p, "csv", "html")
    p = sub.add_parser("job_costs", help="cost of every job from Snakemake's benchmark files")
    cli.add_inputs(p, "config")
    p.add_argument("--outdir", required=True, help="results directory (holds benchmarks/)")
    p.add_argument("--environment", required=True, help="provenance/environment.json")
    cli.add_outputs(p, "csv", "html", "figure")
    p = sub.add_parser("features", help="a dictionary's page of the feature browser")
    p.add_argument("--features-dir", required=True, help="its features/{site}/layer_{layer} folder")
    p.add_argument("--n-top", type=int, default=features_page.N_TOP, help="top contexts shown")
    p.add_argument(
        "--n-per-band",
        type=int,
        default=features_page.N_PER_BAND,
        help="quantile-sampled contexts shown per band",
    )
    cli.add_outputs(p, "html", html="report/features/{site}/layer_{layer}.html")
    p = sub.add_parser("features_index", help="the feature browser's index of every dictionary")
    p.add_argument(
        "--features-dirs", nargs="+", required=True, help="features/{site}/layer_{layer} folders"
    )
    cli.add_outputs(p, "html", html="report/features.html")
    a, config = cli.parse(parser)
    if a.command == "sae":
        stage.sae_summary(
            a.saes, a.out_csv, a.out_html, a.out_figure, a.out_controller, a.features_dirs
        )
    elif a.command == "baseline":
        stage.baseline(a.json, a.out_csv, a.out_html)
    elif a.command == "behaviour":
        stage.behaviour(
            a.behaviour, a.attribution_dir, a.interventions_dir, a.out_html, a.top,
            a.prompt_graphs, a.features_dirs,
        )  # fmt: skip
        if a.out_graph:
            stage.graph_page(
                a.behaviour, a.attribution_dir, a.interventions_dir, a.out_graph, a.features_html
            )
    elif a.command == "provenance":
        stage.provenance(a.provenance_dir, a.out_html)
    elif a.command == "gpu_hours":
        stage.gpu_hours(
            a.suite, config, a.reference_config, a.out_csv, a.out_html, a.gpu, a.max_runtime or None
        )
    elif a.command == "features":
        features_page.write_dictionary_page(a.features_dir, a.out_html, a.n_top, a.n_per_band)
    elif a.command == "features_index":
        features_page.write_index(a.features_dirs, a.out_html)
    else:
        stage.job_costs(config, a.outdir, a.environment, a.out_csv, a.out_html, a.out_figure)


if __name__ == "__main__":
    cli.main(run)
