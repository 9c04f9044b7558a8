#!/usr/bin/env python
"""Diff the metrics of two results directories (baseline, SAE metrics, top attribution nodes,
faithfulness and completeness) and print what changed beyond the tolerance. Exit 0 when they
agree, 1 when something differs, 2 when a directory holds no results."""

import sys

from circuitflow import cli
from circuitflow.compare import compare_dirs


def run() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("a", help="results directory A (e.g. the workstation run)")
    parser.add_argument("b", help="results directory B (e.g. the CSD3 run)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (numbers)")
    parser.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance (numbers)")
    args, _ = cli.parse(parser)
    n, diffs = compare_dirs(args.a, args.b, args.rtol, args.atol)
    for diff in diffs:
        print(diff)
    tol = f"rtol {args.rtol:g}, atol {args.atol:g}"
    if diffs:
        print(f"{len(diffs)} of {n} metrics differ ({tol})")
        sys.exit(1)
    print(f"all {n} metrics agree ({tol})")


if __name__ == "__main__":
    cli.main(run)
