#!/usr/bin/env python
"""Interventions: test attribution's claims by ablating and steering.

`behaviour`: circuits (faithfulness, completeness, random controls), single-head and head-set
ablations, feature ablation and steering for one behaviour, into --out-dir.
`across`: one table (and figure) of single-head effects across behaviours.
"""

from circuitflow import cli
from circuitflow.interventions import across


def run() -> None:
    parser = cli.parser(__doc__)
    sub = cli.subcommands(parser)
    one = sub.add_parser("behaviour", help="all interventions for one behaviour")
    cli.add_inputs(one, "config", "behaviour", "prompts", "model-json", "attribution-dir", "saes")
    cli.add_outputs(one, "dir")
    many = sub.add_parser("across", help="single-head effects across behaviours")
    many.add_argument("--behaviours", nargs="+", required=True)
    many.add_argument("--heads", nargs="+", required=True, help="interventions heads.parquet files")
    many.add_argument("--out", required=True, help="heads_across_behaviours.parquet")
    cli.add_outputs(many, "figure")
    a, config = cli.parse(parser)
    if a.command == "across":
        across.across(a.behaviours, a.heads, a.out, a.out_figure)
        return
    # The model's libraries: not for `across`, a table and a figure (seconds of CPU a job).
    from circuitflow.interventions import stage, summary

    s = stage.run(
        config, a.behaviour, a.prompts, a.model_json, a.attribution_dir, a.saes, a.out_dir
    )
    print(summary.headline(a.behaviour, s))


if __name__ == "__main__":
    cli.main(run)
