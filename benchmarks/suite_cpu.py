"""What each test costs the suite in CPU seconds: sums the lines tests/conftest.py appends to
$CIRCUITFLOW_TEST_CPU (each test phase's CPU, Snakemake's and its jobs' included) and prints
the largest, with the total and each one's share; with --timeline, minute by minute, the CPU
the tests used (each phase's spread evenly over its wall time) and what each worker ran, to
find where cores stood idle.

    CIRCUITFLOW_TEST_CPU=/tmp/cpu.jsonl make test
    python benchmarks/suite_cpu.py /tmp/cpu.jsonl --top 30 --timeline
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the file CIRCUITFLOW_TEST_CPU named")
    parser.add_argument("--top", type=int, default=25, help="how many tests to list")
    parser.add_argument("--timeline", action="store_true", help="minute by minute")
    args = parser.parse_args(argv)
    cpu, wall = defaultdict(float), defaultdict(float)
    rows = []
    with open(args.log) as f:
        for line in f:
            row = json.loads(line)
            rows.append(row)
            key = f"{row['test']} ({row['when']})"
            cpu[key] += row["cpu_s"]
            wall[key] += row["wall_s"]
    total = sum(cpu.values())
    print(f"{len(cpu)} test phases, {total:.0f} CPU-s in all ({total / 60:.1f} CPU-min)")
    print(f"{'CPU-s':>8} {'share':>6} {'wall-s':>8}  test (phase)")
    for key in sorted(cpu, key=cpu.get, reverse=True)[: args.top]:
        print(f"{cpu[key]:8.1f} {cpu[key] / total:6.1%} {wall[key]:8.1f}  {key}")
    if args.timeline:
        timeline(rows)


def timeline(rows: list[dict]) -> None:
    """Per minute from the first phase's start: the CPU-s the phases used in it (a phase's CPU
    spread evenly over its wall time) and, per worker, the longest phase running then."""
    timed = [r for r in rows if "start" in r]
    if not timed:
        print("no start times in the log (logged since the suite's timeline was added)")
        return
    t0 = min(r["start"] for r in timed)
    end = max(r["start"] + r["wall_s"] for r in timed)
    workers = sorted({r.get("worker", "?") for r in timed})
    print(f"\nminute  CPU-s  {'  '.join(f'{w:<40}' for w in workers)}")
    for m in range(int((end - t0) // 60) + 1):
        lo, hi = t0 + 60 * m, t0 + 60 * (m + 1)
        used, busy = 0.0, {}
        for r in timed:
            a, b = r["start"], r["start"] + r["wall_s"]
            overlap = max(0.0, min(b, hi) - max(a, lo))
            if overlap > 0:
                used += r["cpu_s"] * overlap / max(r["wall_s"], 1e-9)
                w = r.get("worker", "?")
                if overlap > busy.get(w, (0.0, ""))[0]:
                    busy[w] = (overlap, r["test"].split("::")[-1][:38])
        cells = "  ".join(f"{busy.get(w, (0, '-'))[1]:<40}" for w in workers)
        print(f"{m:6d} {used:6.0f}  {cells}")


if __name__ == "__main__":
    main()
