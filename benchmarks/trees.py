"""Today's code beside this checkout's, for the benchmarks that set them side by side
(attribution.py, capture.py): each code tree runs the benchmark's worker in its own process,
and the figures go into the JSON as soon as each is measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def export(ref: str, into: Path) -> Path | None:
    """`ref`'s src/ (and workflow/, whose schema it reads) under `into`, by `git archive`; None
    where git cannot (a copy of the tree without its repository)."""
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "src", "workflow"],
                                 capture_output=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def trees(ref: str, into: Path, data: dict) -> list[tuple[str, Path]]:
    """[("new", this checkout's src), ("today", `ref`'s)]; where `ref` cannot be exported,
    the new one alone and `data["baseline_note"]` says why."""
    old = export(ref, into)
    if old is None:
        data["baseline_note"] = f"no git repository here: {ref} not run"
    return [("new", REPO / "src")] + ([("today", old)] if old else [])


def run_worker(script: str, src: Path, args: list[str]) -> dict:
    """The last line of `script --worker ARGS` run on code tree `src`, as JSON."""
    cmd = [sys.executable, script, "--worker", *args]
    env = {**os.environ, "PYTHONPATH": str(src), "TQDM_DISABLE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{script} on {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write(path: Path | None, data: dict) -> None:
    """The figures so far, atomically (a run cut short keeps them)."""
    if path is not None:
        from circuitflow.io import write_json

        write_json(path, data)


def parse(ap, worker) -> tuple | None:
    """The options every such benchmark takes (--device, --baseline-ref, --json) added to `ap`
    and parsed; in a worker's process (--worker) `worker(args)`'s figures printed as JSON and
    None returned, else (args, whether the device is a GPU) with the device resolved."""
    import argparse

    ap.add_argument("--device", default=None, help="cuda if present, else cpu")
    ap.add_argument("--baseline-ref", default="main", help="git ref of today's code")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return None
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return args, args.device.startswith("cuda")
