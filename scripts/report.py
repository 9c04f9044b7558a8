#!/usr/bin/env python
"""The report's pages (rules in report.smk), one subcommand each: `sae` (SAE metrics per layer
and the L0 controller), `baseline` (every behaviour's baseline metrics), `behaviour` (top
attribution nodes, faithfulness and completeness with controls, head ablations; and the
attribution graph's page with the steering results), `provenance`
(the reproducibility checklist), `gpu_hours` (GPU-hours of a full run from the GPU benchmark
suite's results) and `job_costs` (wall time, memory and GPU-hours of every job). HTML pages for
the report, CSVs beside them."""

import argparse

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.report import stage


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sae", help="SAE metrics per layer")
    p.add_argument("--saes", nargs="+", required=True, help="SAE directories")
    for name in ("csv", "html", "figure", "controller"):
        p.add_argument(f"--out-{name}", required=True)
    p = sub.add_parser("baseline", help="baseline metrics of every behaviour")
    p.add_argument("--json", nargs="+", required=True, help="baseline/{behaviour}.json files")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-html", required=True)
    p = sub.add_parser("behaviour", help="attribution and interventions tables of a behaviour")
    p.add_argument("--behaviour", required=True)
    p.add_argument("--attribution-dir", required=True)
    p.add_argument("--interventions-dir", required=True)
    p.add_argument("--top", type=int, default=15, help="rows per table")
    p.add_argument("--out-html", required=True)
    p.add_argument("--out-graph", help="the attribution graph page with steering results")
    p = sub.add_parser("provenance", help="the reproducibility checklist")
    p.add_argument("--provenance-dir", required=True)
    p.add_argument("--out-html", required=True)
    p = sub.add_parser("gpu_hours", help="GPU-hours of a full run from GPU suite results")
    p.add_argument("--suite", nargs="*", default=[], help="benchmarks/results/*.json")
    p.add_argument("--config", required=True, help="this run's resolved config (JSON or YAML)")
    p.add_argument("--reference-config", required=True, help="e.g. config/qwen2.5-0.5b.yaml")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-html", required=True)
    p = sub.add_parser("job_costs", help="cost of every job from Snakemake's benchmark files")
    p.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    p.add_argument("--outdir", required=True, help="results directory (holds benchmarks/)")
    p.add_argument("--environment", required=True, help="provenance/environment.json")
    for name in ("csv", "html", "figure"):
        p.add_argument(f"--out-{name}", required=True)
    a = parser.parse_args()
    if a.command == "sae":
        stage.sae_summary(a.saes, a.out_csv, a.out_html, a.out_figure, a.out_controller)
    elif a.command == "baseline":
        stage.baseline(a.json, a.out_csv, a.out_html)
    elif a.command == "behaviour":
        stage.behaviour(a.behaviour, a.attribution_dir, a.interventions_dir, a.out_html, a.top)
        if a.out_graph:
            stage.graph_page(a.behaviour, a.attribution_dir, a.interventions_dir, a.out_graph)
    elif a.command == "provenance":
        stage.provenance(a.provenance_dir, a.out_html)
    elif a.command == "gpu_hours":
        stage.gpu_hours(
            a.suite, cf_config.load(a.config), a.reference_config, a.out_csv, a.out_html
        )
    else:
        stage.job_costs(
            cf_config.load(a.config), a.outdir, a.environment, a.out_csv, a.out_html, a.out_figure
        )


if __name__ == "__main__":
    main(run)
