#!/usr/bin/env python
"""Attribution for one behaviour: which heads, MLPs, SAE features and error terms drive the
logit difference; writes tables, graph.json, figures and feature contexts into --out-dir."""

from circuitflow import cli
from circuitflow.attribution import stage


def run() -> None:
    p = cli.parser(__doc__)
    cli.add_inputs(p, "config", "behaviour", "prompts", "model-json", "saes")
    p.add_argument("--activations", nargs="*", default=[], help="their activation files, if any")
    p.add_argument(
        "--features", nargs="*", default=[], help="features/{site}/layer_N: labels and contexts"
    )
    cli.add_outputs(p, "dir")
    a, config = cli.parse(p)
    summary = stage.run(
        config,
        a.behaviour,
        a.prompts,
        a.model_json,
        a.saes,
        a.activations,
        a.out_dir,
        a.features,
    )
    print(stage.headline(summary))


if __name__ == "__main__":
    cli.main(run)
