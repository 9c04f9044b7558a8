#!/usr/bin/env python
"""GPU-hours of a full run from a GPU suite result (benchmarks/gpu_suite.py): each stage's jobs,
work and hours on a GPU type (a profile's gpu_type), measured or projected by roofline share;
with --markdown the table docs/csd3.md shows."""

import pandas as pd

from circuitflow import cli, perf
from circuitflow.report import gpu_hours


def run() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--gpu", default=gpu_hours.A100, choices=sorted(perf.NOMINAL_PEAK_FLOPS),
                        help="the GPU the hours are for (a profile's gpu_type)")  # fmt: skip
    parser.add_argument("suite", help="benchmarks/results/<device>.json")
    parser.add_argument(
        "--config", default="config/qwen2.5-0.5b.yaml", help="the run's config file"
    )
    parser.add_argument("--markdown", action="store_true", help="the table docs/csd3.md shows")
    args, config = cli.parse(parser)
    suite = gpu_hours.load_suite(args.suite)
    frame = gpu_hours.estimate(suite, config, gpu=args.gpu)
    if args.markdown:
        print(gpu_hours.markdown(frame))
        return
    print(f"{args.config}: {gpu_hours.describe(suite, args.gpu)}")
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    cli.main(run)
