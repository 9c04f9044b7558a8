"""`python -m circuitflow.memory runtime`: re-measure the resident set of each kind of job's
imports (memory.runtime.RUNTIME_MB); the GPU batch-size presets are `python -m
circuitflow.report.presets`."""

import argparse

from circuitflow.memory.probes import MiB
from circuitflow.memory.runtime import RUNTIME_MB, RUNTIME_MODULES, measure_runtime_bytes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m circuitflow.memory", description=__doc__)
    p.add_argument("command", choices=["runtime"])
    p.parse_args(argv)
    for kind in RUNTIME_MODULES:
        measured = measure_runtime_bytes(kind) / MiB
        print(f"{kind}: {measured:.0f} MiB (RUNTIME_MB: {RUNTIME_MB[kind]})")


if __name__ == "__main__":
    main()
