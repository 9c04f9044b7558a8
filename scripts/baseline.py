#!/usr/bin/env python
"""Score a behaviour's prompts on the unmodified model: summary JSON, per-prompt parquet and a
logit-difference / calibration figure."""

from circuitflow import baseline, cli


def run() -> None:
    p = cli.parser(__doc__)
    cli.add_inputs(p, "config", "behaviour", "prompts", "model-json")
    cli.add_outputs(p, "json", "parquet", "figure")
    a, config = cli.parse(p)
    summary = baseline.run(
        config, a.behaviour, a.prompts, a.model_json, a.out_json, a.out_parquet, a.out_figure
    )
    print(
        f"{a.behaviour}: logit_diff_mean {summary['logit_diff_mean']:.3f}, "
        f"accuracy {summary['accuracy']:.3f} over {summary['n_prompts']} prompts"
    )


if __name__ == "__main__":
    cli.main(run)
