"""What each test costs the suite in CPU seconds: sums the lines tests/conftest.py appends to
$CIRCUITFLOW_TEST_CPU (each test phase's CPU, Snakemake's and its jobs' included) and prints
the largest, with the total and each one's share.

    CIRCUITFLOW_TEST_CPU=/tmp/cpu.jsonl make test
    python benchmarks/suite_cpu.py /tmp/cpu.jsonl --top 30
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the file CIRCUITFLOW_TEST_CPU named")
    parser.add_argument("--top", type=int, default=25, help="how many tests to list")
    args = parser.parse_args(argv)
    cpu, wall = defaultdict(float), defaultdict(float)
    with open(args.log) as f:
        for line in f:
            row = json.loads(line)
            key = f"{row['test']} ({row['when']})"
            cpu[key] += row["cpu_s"]
            wall[key] += row["wall_s"]
    total = sum(cpu.values())
    print(f"{len(cpu)} test phases, {total:.0f} CPU-s in all ({total / 60:.1f} CPU-min)")
    print(f"{'CPU-s':>8} {'share':>6} {'wall-s':>8}  test (phase)")
    for key in sorted(cpu, key=cpu.get, reverse=True)[: args.top]:
        print(f"{cpu[key]:8.1f} {cpu[key] / total:6.1%} {wall[key]:8.1f}  {key}")


if __name__ == "__main__":
    main()
