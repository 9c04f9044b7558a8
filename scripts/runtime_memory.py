#!/usr/bin/env python
"""Re-measure the resident set of each kind of job's imports in a fresh interpreter and print it
beside the planned value (memory.runtime.RUNTIME_MB, which each job's memory request adds)."""

from circuitflow import cli
from circuitflow.memory.probes import MiB
from circuitflow.memory.runtime import RUNTIME_MB, RUNTIME_MODULES, measure_runtime_bytes


def run() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--kind", choices=list(RUNTIME_MODULES), help="one kind (default: all)")
    args, _ = cli.parse(parser)
    for kind in [args.kind] if args.kind else RUNTIME_MODULES:
        measured = measure_runtime_bytes(kind) / MiB
        print(f"{kind}: {measured:.0f} MiB (RUNTIME_MB: {RUNTIME_MB[kind]})")


if __name__ == "__main__":
    cli.main(run)
