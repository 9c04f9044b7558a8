#!/usr/bin/env python
"""GPU presets: the batch size each stage's memory plan picks per GPU type and real model, as the
Markdown table docs/csd3.md shows (a test checks the table against the code)."""

from circuitflow import cli
from circuitflow.attribution import methods
from circuitflow.report import presets


def run() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument(
        "--fraction", type=float, default=0.8, help="share of GPU memory to plan for"
    )
    parser.add_argument("--method", default="ig", choices=list(methods.REGISTRY),
                        help="attribution method")  # fmt: skip
    args, _ = cli.parse(parser)
    rows = presets.gpu_presets(fraction=args.fraction, attribution_method=args.method)
    print(presets.presets_markdown(rows))


if __name__ == "__main__":
    cli.main(run)
