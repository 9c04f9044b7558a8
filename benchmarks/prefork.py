"""What forking stage jobs from a warm interpreter (circuitflow.prefork) saves a small run: the
same DAG (.test/config/tiny.yaml to its interventions, ~20 jobs) run with every job in a fresh
interpreter and with the model-loading jobs forked, side by side, in alternating order; CPU
seconds of everything each run started (Snakemake, its jobs, the server and what it forked) and
wall time, each run's figures and their ratio. Also checks that both runs wrote the same
interventions summary (its timings aside).

    python benchmarks/prefork.py --rounds 2 --json /tmp/prefork.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from circuitflow import prefork

REPO = Path(__file__).resolve().parents[1]
TARGET = "interventions/induction/summary.json"


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(root: Path, forked: bool, cores: int) -> dict:
    """One run of the tiny config to TARGET in `root`: its CPU seconds (the server's included,
    its start-up too, counted once the server is waited for) and wall time."""
    config = yaml.safe_load((REPO / ".test" / "config" / "tiny.yaml").read_text())
    config["outdir"] = str(root / "results")
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    server = None
    if forked:
        env["CIRCUITFLOW_PREFORK"] = path = str(root / "prefork.socket")
        server = prefork.start(path)
        prefork.wait_listening(server, path)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
             "--directory", str(REPO), "--configfile", str(root / "config.yaml"),
             "--cores", str(cores), "--nolock", str(root / "results" / TARGET)],
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    if done.returncode != 0:
        kind = "forked" if forked else "fresh"
        raise SystemExit(f"the {kind} run failed:\n{done.stderr[-3000:]}")
    jobs = sum(1 for _ in (root / "results" / "logs").rglob("*.log"))
    return {"forked": forked, "cpu_s": children_cpu_s() - cpu0,
            "wall_s": time.perf_counter() - t0, "job_logs": jobs,
            "summary": json.loads((root / "results" / TARGET).read_text())}  # fmt: skip


def findings(summary: dict) -> dict:
    """An interventions summary without its timings (`seconds`), which differ run to run."""
    return {k: v for k, v in summary.items() if k != "seconds"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs, order alternating")
    parser.add_argument("--cores", type=int, default=2, help="Snakemake's --cores")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="cf-prefork-bench-") as tmp:
        for r in range(args.rounds):
            for forked in (r % 2 == 1, r % 2 == 0):
                runs.append(run(Path(tmp) / f"{r}-{forked}", forked, args.cores))
                last = runs[-1]
                print(f"round {r}: {'forked' if forked else 'fresh '}  {last['cpu_s']:7.1f} CPU-s"
                      f"  {last['wall_s']:6.1f} s wall")  # fmt: skip

    def mean(forked: bool, key: str) -> float:
        values = [x[key] for x in runs if x["forked"] == forked]
        return sum(values) / len(values)

    same = all(findings(x["summary"]) == findings(runs[0]["summary"]) for x in runs)
    result = {
        "target": TARGET, "config": ".test/config/tiny.yaml", "cores": args.cores,
        "fresh_cpu_s": mean(False, "cpu_s"), "forked_cpu_s": mean(True, "cpu_s"),
        "fresh_wall_s": mean(False, "wall_s"), "forked_wall_s": mean(True, "wall_s"),
        "job_logs": runs[0]["job_logs"], "same_summary": same,
        "runs": [{k: v for k, v in x.items() if k != "summary"} for x in runs],
    }  # fmt: skip
    result["cpu_ratio"] = result["fresh_cpu_s"] / result["forked_cpu_s"]
    result["wall_ratio"] = result["fresh_wall_s"] / result["forked_wall_s"]
    print(f"fresh / forked: CPU {result['cpu_ratio']:.2f}x, wall {result['wall_ratio']:.2f}x "
          f"({result['job_logs']} job logs a run); same interventions summary: {same}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
