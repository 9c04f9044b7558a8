#!/usr/bin/env python
"""Tables and summary figures for the report: `sae` (SAE metrics per layer and the L0
controller), `baseline` (every behaviour's baseline metrics), `behaviour` (top attribution
nodes, faithfulness and completeness with controls, head ablations), `provenance` (the
reproducibility checklist) and `gpu_hours` (GPU-hours of a full run from the GPU benchmark
suite's results). HTML pages for the report, CSVs beside them."""

import argparse
from pathlib import Path

import pandas as pd

from circuitflow import config as cf_config
from circuitflow import report_tables as rt
from circuitflow.cli import main
from circuitflow.io import save_figure, write_text


def _csv(path, frame) -> None:
    write_text(path, frame.to_csv(index=False))


def sae(args) -> None:
    metrics = rt.read_sae_metrics(args.saes)
    table = rt.sae_table(metrics)
    _csv(args.out_csv, table)
    intro = (
        "One row per trained SAE (saes/{site}/layer_{layer}/metrics.json). l0: mean active "
        "latents per token; explained_variance of the activations; ce_loss_recovered: (CE "
        "zero-ablated - CE with the SAE) / (CE zero-ablated - clean CE); dead_fraction: latents "
        "that never fired over the last dead_window_tokens."
    )
    write_text(
        args.out_html, rt.page("SAE metrics per layer", [("SAEs", rt.table_html(table))], intro)
    )
    save_figure(args.out_figure, rt.plot_sae_metrics(table))
    save_figure(args.out_controller, rt.plot_controller(metrics))


def baseline(args) -> None:
    table = rt.baseline_table(args.json)
    _csv(args.out_csv, table)
    intro = "Baseline of every behaviour on the unmodified model (baseline/{behaviour}.json)."
    write_text(
        args.out_html, rt.page("Baseline metrics", [("Baseline", rt.table_html(table))], intro)
    )


def behaviour(args) -> None:
    sections = rt.behaviour_sections(args.attribution_dir, args.interventions_dir, args.top)
    write_text(args.out_html, rt.page(f"Results of behaviour {args.behaviour}", sections))


def provenance(args) -> None:
    sections = rt.provenance_sections(args.provenance_dir)
    intro = "Everything needed to reproduce this run; the JSON files are in provenance/."
    write_text(args.out_html, rt.page("Provenance", sections, intro))


def gpu_hours(args) -> None:
    from circuitflow import gpu_hours as gh
    from circuitflow import gpu_suite

    run_config = cf_config.load(args.config)
    reference = cf_config.load(args.reference_config)
    name = f"the CSD3 reference run ({Path(args.reference_config).name})"
    sections = rt.gpu_hours_sections(args.suite, run_config, reference, name)
    frames = []
    for path in args.suite:
        try:
            frame = gh.estimate(gpu_suite.load(path), reference)
        except ValueError:
            continue
        frames.append(frame.assign(suite=Path(path).name, config=Path(args.reference_config).name))
    _csv(args.out_csv, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    intro = (
        "A100-hours of a full run, stage by stage, from the rates benchmarks/gpu_suite.py "
        "measured (benchmarks/results/*.json). A result from a GPU other than an A100, or from "
        "a CPU, is projected by its roofline share and says so; baseline and interventions are "
        "not in the suite."
    )
    write_text(args.out_html, rt.page("GPU-hours of a full run", sections, intro))


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sae", help="SAE metrics per layer")
    p.add_argument("--saes", nargs="+", required=True, help="SAE directories")
    for name in ("out_csv", "out_html", "out_figure", "out_controller"):
        p.add_argument("--" + name.replace("_", "-"), required=True)
    p.set_defaults(func=sae)
    p = sub.add_parser("baseline", help="baseline metrics of every behaviour")
    p.add_argument("--json", nargs="+", required=True, help="baseline/{behaviour}.json files")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-html", required=True)
    p.set_defaults(func=baseline)
    p = sub.add_parser("behaviour", help="attribution and interventions tables of a behaviour")
    p.add_argument("--behaviour", required=True)
    p.add_argument("--attribution-dir", required=True)
    p.add_argument("--interventions-dir", required=True)
    p.add_argument("--top", type=int, default=15, help="rows per table")
    p.add_argument("--out-html", required=True)
    p.set_defaults(func=behaviour)
    p = sub.add_parser("provenance", help="the reproducibility checklist")
    p.add_argument("--provenance-dir", required=True)
    p.add_argument("--out-html", required=True)
    p.set_defaults(func=provenance)
    p = sub.add_parser("gpu_hours", help="GPU-hours of a full run from GPU suite results")
    p.add_argument("--suite", nargs="*", default=[], help="benchmarks/results/*.json")
    p.add_argument("--config", required=True, help="this run's resolved config (JSON or YAML)")
    p.add_argument("--reference-config", required=True, help="e.g. config/qwen2.5-0.5b.yaml")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-html", required=True)
    p.set_defaults(func=gpu_hours)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main(run)
