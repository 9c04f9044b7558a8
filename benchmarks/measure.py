#!/usr/bin/env python
"""Measure the whole pipeline on one GPU in one call (issue 39): every benchmark, in order of
what its figures replace, each in its own process with its own share of the time.

    python benchmarks/measure.py                  # cuda: at most 8 minutes (make bench-gpu)
    python benchmarks/measure.py --device cpu     # tiny sizes, ~1 min on 2 cores: the suite runs it
    python benchmarks/measure.py --only sae_train scale --budget 200   # a rerun of some steps

Steps, at GPT-2-small dimensions (random weights; the GPU suite adds Qwen2.5-0.5B's):

1. `gpu_suite`: forward, capture, SAE training (the configs' TopK and the schema's default) and
   attribution, rates against the GPU's peak and the memory plan against the measured peak;
2. `sae_train`: the fast trainer against SAELens's on the same tokens (tokens/s, explained
   variance);
3. `sae_stream`: one streaming job for 12 layers against capture-then-train;
4. `prompt_graphs`: one per-prompt graph on transcoders (seconds, forward equivalents, memory
   against the plan);
5. `scale`: the whole DAG through Snakemake (config/gpt2-small.yaml at reduced counts):
   attribution and interventions forward equivalents and seconds a prompt, each job's host
   peak against its plan.

Each step writes `benchmarks/results/<step>-<gpu>-cuda.json` (`<step>-cpu-smoke.json` under
`--out-dir` on a CPU) as soon as it ends, stamped with the GPU, driver, CUDA, torch and compute
dtype, so a run cut short keeps what finished. A step that fails or outruns its share is
reported and the next one starts. The last screen sets each figure beside the CPU figure or
projection it replaces (the committed `benchmarks/results/*-cpu.json` and `cpu.json`).
circuitflow.resources reads the `gpu_suite-*-cuda.json` whose GPU matches a profile's
`gpu_type` for walltimes (measured rates instead of the planned share of the datasheet peak).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    cuda_args: str  # the benchmark's own options, on a GPU
    cpu_args: str  # at smoke sizes (--device cpu)
    share: float  # of the whole budget, when every step runs
    out_flag: str = "--json"


STEPS = (
    Step("gpu_suite", "gpu_suite.py",
         "--capture-tokens 65536 --sae-steps 40 --prompts 64",
         "--small", 0.17, out_flag="--out"),
    Step("sae_train", "sae_train.py",
         "--sizes gpt2 --steps 100 --rounds 3",
         "--sizes small --steps 6 --rounds 1", 0.08),
    Step("sae_stream", "sae_stream.py",
         "--tokens 65536 --batch 4096 --rounds 2",
         "--layers 2 --tokens 1024 --batch 128 --rounds 1 --eval-contexts 2 --expansion 1 --k 4",
         0.12),
    Step("prompt_graphs", "prompt_graphs.py",
         "--max-feature-nodes 4096 --expansion 32",
         "--positions 4 --expansion 1 --k 2 --max-feature-nodes 8 --batch 16 --n-layers 2",
         0.08),
    # The whole DAG, ~24 jobs, its 9 GPU jobs one at a time (~15 s of start-up each): about
    # 300 s on an H200 (2026-11-27), so it gets the largest share.
    Step("scale", "scale.py", "--reduced", "--dry-run", 0.55, out_flag="--out"),
)  # fmt: skip
STEP_NAMES = [s.name for s in STEPS]


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def environment(device: str) -> dict:
    """What produced the figures: the GPU, its driver, CUDA, torch and the compute dtype the
    stages pick (`model.dtype: auto`)."""
    import platform

    import torch

    from circuitflow.devices import resolve_dtype

    env = {
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "compute_dtype": str(resolve_dtype("auto", device)).removeprefix("torch."),
        "sae_dtype": "float32",
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env |= {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": nvidia_smi("driver_version"),
        }
    return env


def nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


def result_name(step: str, device: str, env: dict) -> str:
    if device.startswith("cuda"):
        return f"{step}-{gpu_slug(env['gpu'])}-cuda.json"
    return f"{step}-cpu-smoke.json"


def run_step(step: Step, device: str, out: Path, seconds: float, log_dir: Path) -> dict:
    """Run one benchmark in its own process for at most `seconds`; its figures land in `out`."""
    args = shlex.split(step.cuda_args if device.startswith("cuda") else step.cpu_args)
    cmd = [sys.executable, str(REPO / "benchmarks" / step.script), *args, step.out_flag, str(out)]
    if step.name != "scale":
        cmd += ["--device", device]
    else:
        cmd += ["--device", "cuda" if device.startswith("cuda") else "cpu"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    log = log_dir / f"{step.name}.log"
    t0 = time.perf_counter()
    status = "ok"
    with log.open("w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        # Its own process group: a step cut short takes its children (Snakemake and its jobs,
        # in scale) with it.
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            if proc.wait(timeout=max(1.0, seconds)) != 0:
                status = f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"cut at {seconds:.0f} s"
    wall = time.perf_counter() - t0
    if status == "ok" and not out.is_file():
        status = "failed (no result file)"
    return {"step": step.name, "status": status, "wall_s": wall, "log": str(log),
            "command": " ".join(cmd[1:])}  # fmt: skip


def stamp(path: Path, env: dict, outcome: dict) -> None:
    """Add what produced the figures to a step's result file (atomically)."""
    from circuitflow.io import write_json

    data = json.loads(path.read_text())
    data["environment"] = env
    data["measure"] = {k: outcome[k] for k in ("command", "wall_s")}
    write_json(path, data)


# --- the screen --------------------------------------------------------------------------------
def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fmt(v, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, str):
        return v
    a = abs(v)
    text = f"{v:,.0f}" if a >= 100 else f"{v:.3g}"
    return text + unit


def suite_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    rows = []
    old = {(r["model"], r["stage"], r.get("variant")): r for r in (cpu or {}).get("results", [])}
    for r in new["results"]:
        key = (r["model"], r["stage"], r.get("variant"))
        o = old.get(key, {})
        name = f"{r['model']} {r['stage']} ({r.get('variant')})"
        rows.append((f"{name}: tokens/s", fmt(r.get("tokens_per_s")), fmt(o.get("tokens_per_s"))))
        rows.append((f"{name}: share of peak", fmt(r.get("roofline_share"), ""),
                     fmt(o.get("roofline_share"))))  # fmt: skip
        if r.get("plan_ratio"):
            rows.append((f"{name}: memory plan / peak", fmt(r["plan_ratio"]),
                         fmt(o.get("plan_ratio"))))  # fmt: skip
    return rows


def hours_lines(new: dict, cpu: dict | None, gpu_type: str) -> list[tuple[str, str, str]]:
    """A100-hours (and hours on the measured GPU) of config/qwen2.5-0.5b.yaml and
    config/gpt2-small.yaml from this run's suite, beside those projected from the CPU's."""
    from circuitflow.report import gpu_hours

    rows = []
    for cfg in ("qwen2.5-0.5b", "gpt2-small"):
        config = gpu_hours.load_config(REPO / "config" / f"{cfg}.yaml")
        for gpu in dict.fromkeys(("A100", gpu_type)):
            try:
                got = gpu_hours.estimate(new, config, gpu=gpu, allow_small=True)
                was = gpu_hours.estimate(cpu, config, gpu=gpu) if cpu else None
            except (ValueError, KeyError) as err:
                rows.append((f"{cfg} {gpu}-hours", f"({err})", ""))
                continue
            how = "measured" if gpu_hours.measured_on(new, gpu) else "projected"
            for stage, h in zip(got["stage"], got["gpu_hours"], strict=True):
                old = None
                if was is not None and stage in set(was["stage"]):
                    old = float(was.loc[was["stage"] == stage, "gpu_hours"].iloc[0])
                rows.append((f"{cfg} {stage}: {gpu}-hours ({how})", fmt(h), fmt(old)))
    return rows


def sae_train_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    cpu = cpu or {}
    size = new["headline_size"]
    s, o = new["sizes"][size], (cpu.get("sizes") or {}).get(size, {})
    return [
        (f"sae_train {size}: fast tokens/s", fmt(s["fast_tokens_per_s"]),
         fmt(o.get("fast_tokens_per_s"))),
        (f"sae_train {size}: SAELens tokens/s", fmt(s["saelens_tokens_per_s"]),
         fmt(o.get("saelens_tokens_per_s"))),
        (f"sae_train {size}: fast / SAELens", fmt(s["speedup_vs_saelens"]),
         fmt(o.get("speedup_vs_saelens"))),
        (f"sae_train {size}: explained variance fast (SAELens - fast)",
         f"{s['explained_variance']['fast']:.3f} ({s['explained_variance_delta']:+.1e})",
         fmt((o.get("explained_variance") or {}).get("fast"))),
        (f"sae_train {size}: SAE step's share of the dense roofline (fast, SAELens)",
         f"{s['fast_share_of_roofline']:.2f}, {s['saelens_share_of_roofline']:.2f}",
         f"{fmt(o.get('fast_share_of_roofline'))}, {fmt(o.get('saelens_share_of_roofline'))}"),
    ]  # fmt: skip


def sae_stream_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    cpu = cpu or {}
    rows = []
    for path in ("capture_then_train", "stream_one_pass", "stream_per_layer"):
        p, o = new["paths"].get(path, {}), (cpu.get("paths") or {}).get(path, {})
        rows.append((f"sae_stream {path}: tokens/s", fmt(p.get("tokens_per_s")),
                     fmt(o.get("tokens_per_s"))))  # fmt: skip
    rows.append(("sae_stream: stream / capture-then-train", fmt(new.get("stream_vs_capture")),
                 fmt(cpu.get("stream_vs_capture"))))  # fmt: skip
    return rows


def prompt_graph_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    cpu = cpu or {}
    secs = sum(new["seconds"].values())
    old = sum((cpu.get("seconds") or {}).values()) or None
    return [
        ("prompt_graphs: seconds a graph", fmt(secs), fmt(old)),
        ("prompt_graphs: forward equivalents a graph", fmt(new["forward_equivalents_total"]),
         fmt(cpu.get("forward_equivalents_total"))),
        ("prompt_graphs: seconds a row", fmt(new["seconds_per_row"]),
         fmt(cpu.get("seconds_per_row"))),
        ("prompt_graphs: memory plan / peak", fmt(new["plan_over_measured"]),
         fmt(cpu.get("plan_over_measured"))),
    ]  # fmt: skip


def scale_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    if new.get("dry_run"):
        return [("scale: DAG planned (dry run)", f"{new['jobs']} jobs", "")]
    cpu = cpu or {}
    rows = []
    for stage, s in new["stages"].items():
        o = (cpu.get("stages") or {}).get(stage, {})
        unit = s.get("forward_equivalents_unit") or "prompt"
        rows.append((f"scale {stage}: forward equivalents a {unit}",
                     fmt(s.get("forward_equivalents_per_prompt")),
                     fmt(o.get("forward_equivalents_per_prompt"))))  # fmt: skip
        rows.append((f"scale {stage}: seconds a {unit}", fmt(s.get("seconds_per_unit")),
                     fmt(o.get("seconds_per_unit"))))  # fmt: skip
        if s.get("planned_peak_mb"):
            rows.append((f"scale {stage}: host memory plan / peak",
                         fmt(s["planned_peak_mb"] / s["peak_mb"]),
                         fmt(o["planned_peak_mb"] / o["peak_mb"]) if o.get("planned_peak_mb")
                         else "-"))  # fmt: skip
    rows.append(("scale: A100-hours of a full gpt2-small run", fmt(new["a100_hours_full_config"]),
                 fmt(cpu.get("a100_hours_full_config"))))  # fmt: skip
    return rows


CPU_FILES = {
    "gpu_suite": "cpu.json",
    "sae_train": "sae_train-cpu.json",
    "sae_stream": "sae_stream-cpu.json",
    "prompt_graphs": "prompt_graphs-cpu.json",
    "scale": "scale-cpu.json",
}
LINES = {
    "gpu_suite": suite_lines,
    "sae_train": sae_train_lines,
    "sae_stream": sae_stream_lines,
    "prompt_graphs": prompt_graph_lines,
    "scale": scale_lines,
}


def screen(outcomes: list[dict], files: dict[str, Path], env: dict, gpu_type: str | None) -> str:
    label = env.get("gpu") or "CPU (smoke sizes)"
    lines = [f"measured on {label}: torch {env['torch']}, CUDA {env.get('cuda') or '-'}, "
             f"driver {env.get('driver') or '-'}, model dtype {env['compute_dtype']}"]  # fmt: skip
    lines += [f"  {o['step']:<14} {o['status']:<24} {o['wall_s']:6.0f} s" for o in outcomes]
    rows: list[tuple[str, str, str]] = []
    for o in outcomes:
        new = load(files[o["step"]]) if o["status"] == "ok" else None
        if new is None:
            continue
        cpu = load(RESULTS / CPU_FILES[o["step"]])
        try:
            rows += LINES[o["step"]](new, cpu)
            if o["step"] == "gpu_suite" and gpu_type:
                rows += hours_lines(new, cpu, gpu_type)
        except (KeyError, TypeError, ValueError) as err:
            rows.append((f"{o['step']}: figures unreadable", f"({type(err).__name__}: {err})", ""))
    width = max([len(r[0]) for r in rows] + [10])
    lines.append(f"{'figure':<{width}}  {'this run':>18}  {'CPU / projection':>18}")
    lines += [f"{a:<{width}}  {b:>18}  {c:>18}" for a, b, c in rows]
    return "\n".join(lines)


def gpu_type_of(name: str) -> str | None:
    from circuitflow import perf

    return next((k for k in perf.NOMINAL_PEAK_FLOPS if k in name.upper()), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default=None, help="cuda (default when a GPU is visible) or cpu")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for all steps (default 480 on a GPU, 120 on a CPU)")  # fmt: skip
    p.add_argument("--only", nargs="+", choices=STEP_NAMES, help="run these steps only")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where result files go (default benchmarks/results on a GPU, a "
                   "temporary folder on a CPU: smoke figures are not results)")  # fmt: skip
    p.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="each step's output (default: a temporary folder, named on the screen)",
    )
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    import tempfile

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is visible (use --device cpu for the smoke sizes)")
    cuda = device.startswith("cuda")
    budget = args.budget or (480.0 if cuda else 120.0)
    out_dir = args.out_dir or (RESULTS if cuda else Path(tempfile.mkdtemp(prefix="measure-")))
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="measure-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = environment(device)
    steps = [s for s in STEPS if not args.only or s.name in args.only]
    deadline = time.perf_counter() + budget
    print(f"measure: {len(steps)} steps on {env.get('gpu', device)} within {budget:.0f} s; "
          f"results in {out_dir}, logs in {log_dir}", flush=True)  # fmt: skip
    outcomes, files = [], {}
    for i, step in enumerate(steps):
        left = deadline - time.perf_counter()
        rest = sum(s.share for s in steps[i:])
        # A step gets its share of what is left; time a step leaves unused passes to the next.
        seconds = left * step.share / rest
        files[step.name] = out = out_dir / result_name(step.name, device, env)
        print(f"[{i + 1}/{len(steps)}] {step.name}: up to {seconds:.0f} s", flush=True)
        if left <= 1:
            outcome = {"step": step.name, "status": "not run (budget spent)", "wall_s": 0.0,
                       "log": "", "command": ""}  # fmt: skip
        else:
            outcome = run_step(step, device, out, seconds, log_dir)
            if outcome["status"] == "ok":
                stamp(out, env, outcome)
            else:
                tail = Path(outcome["log"]).read_text().splitlines()[-15:]
                print("\n".join("    " + x for x in tail), flush=True)
        print(f"    {outcome['status']} in {outcome['wall_s']:.0f} s -> {out.name}", flush=True)
        outcomes.append(outcome)
    print(screen(outcomes, files, env, gpu_type_of(env.get("gpu", "")) if cuda else None))
    return 0 if all(o["status"] == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
