#!/usr/bin/env python
"""Tables and summary figures for the report: `sae` (SAE metrics per layer and the L0
controller), `baseline` (every behaviour's baseline metrics), `behaviour` (top attribution
nodes, faithfulness and completeness with controls, head ablations) and `provenance` (the
reproducibility checklist). HTML pages for the report, CSVs beside them."""

import argparse

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
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main(run)
