#!/usr/bin/env python
"""Measure the whole pipeline on one GPU in one call (issues 39 and 46): every benchmark, in order
of the targets its figures answer, each in its own process with its own share of the time.

The next GPU session's one call, on a lent GPU machine without network (docs/csd3.md, "Measuring
on a lent GPU machine"): here, with network, `python benchmarks/device_wheels.py fetch` (the
wheels and the code before issue 46 into the ignored .whl/), then the device tool's `run` with
carry [".whl"], timeout_s 600 and the command

    make bench-gpu ARCHIVE=$OUT/bench-gpu.tar.gz

(results and logs come back in the archive; the screen ends the output). Elsewhere:

    make bench-gpu                                # cuda: at most 8 minutes, results committed
    python benchmarks/measure.py --device cpu     # smoke sizes (~2 min on 2 cores): the suite's
    python benchmarks/measure.py --only sae_train scale --budget 200   # a rerun of some steps

Steps, at GPT-2-small dimensions (random weights; the GPU suite adds Qwen2.5-0.5B's):

1. `sae_train`: the gpu, fast, SAELens and sparsify trainers on the same tokens (tokens/s,
   explained variance), 20 steps of each under torch.profiler (top ops) and 20 of the gpu
   trainer under torch.cuda.set_sync_debug_mode("error"); first, so that `sae.trainer: auto`
   in the steps after it picks by this run's rates;
2. `sae_stream`: one streaming job for 12 layers against capture-then-train;
3. `attribution`: the fast pass (atp, an SAE on every layer) of the code before issue 46 and
   of this checkout, side by side, as the stage runs it (float32 without TF32);
4. `capture`: capture's bytes/s against the disk's own write rate, both code trees;
5. `gpu_suite`: forward, capture, SAE training and attribution on GPT-2 small and
   Qwen2.5-0.5B, rates against the peak of the dtype each ran in and the memory plan against
   the measured peak (report/gpu_hours.py and circuitflow.resources read it);
6. `prompt_graphs`: one per-prompt graph on transcoders (seconds, forward equivalents,
   memory against the plan);
7. `clt_train`: the cross-layer transcoder's training step (tokens/s, share of the matmul
   peak, and under torch.cuda.set_sync_debug_mode("error"));
8. `scale`: the whole DAG through Snakemake (config/gpt2-small.yaml at reduced counts, with
   transcoders so the per-prompt graphs run; independent GPU jobs side by side on the GPU).

Each step writes `benchmarks/results/<step>-<gpu>-cuda.json` (`<step>-cpu-smoke.json` under
`--out-dir` on a CPU) as its figures come, stamped with the GPU, driver, CUDA, torch and compute
dtype once it ends; a step that fails or outruns its share is reported, the figures it wrote
are kept, and the next one starts. The last screen sets each figure beside the CPU figure or
projection it replaces (the committed `benchmarks/results/*-cpu.json` and `cpu.json`), then
each of issue 46's targets beside its figure, met or not; `measure-<gpu>-cuda.json` holds the
steps' outcomes and the targets. circuitflow.resources reads the `gpu_suite-*-cuda.json`
whose GPU matches a profile's `gpu_type` for walltimes (measured rates instead of the planned
share of the datasheet peak).
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
from collections.abc import Callable
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


# The code the issue's "today" figures are of: main before issue 46's work. attribution.py and
# capture.py run it beside this checkout (device_wheels.py packs it where git is missing).
BEFORE_ISSUE_46 = "eeb35b1"
STEPS = (
    # 4 trainers x 3 rounds of 100 steps, then 20 profiled steps of each and the sync check:
    # about 70 s on an H200 (2 trainers took 34 s, 2026-11-27): 86 s of 480 when all run.
    Step("sae_train", "sae_train.py",
         "--sizes gpt2 --steps 100 --rounds 3 --profile-steps 20 --sync-check-steps 20",
         "--sizes small --steps 6 --rounds 1 --profile-steps 2 --sync-check-steps 2", 0.18),
    Step("sae_stream", "sae_stream.py",
         "--tokens 131072 --batch 4096 --rounds 1",
         "--layers 2 --tokens 1024 --batch 128 --rounds 1 --eval-contexts 2 --expansion 1 --k 4",
         0.13),
    Step("attribution", "attribution.py",
         f"--rounds 1 --repeats 2 --baseline-ref {BEFORE_ISSUE_46}",
         "--layers 1 --d-sae 64 --k 4 --prompts 4 --length 8 --batch 2 --validation 2 "
         "--rounds 1 --repeats 1 --baseline-ref none", 0.10),
    Step("capture", "capture.py", f"--rounds 1 --baseline-ref {BEFORE_ISSUE_46}",
         "--sizes embedded --scale 0.005 --rounds 1 --baseline-ref none", 0.09),
    Step("gpu_suite", "gpu_suite.py",
         "--capture-tokens 65536 --sae-steps 40 --prompts 64",
         "--small", 0.15, out_flag="--out"),
    Step("prompt_graphs", "prompt_graphs.py",
         "--max-feature-nodes 4096 --expansion 32",
         "--positions 4 --expansion 1 --k 2 --max-feature-nodes 8 --batch 16 --n-layers 2",
         0.05),
    # GPT-2 small's shape, 8,192 features a layer: about 10 GB of weights, gradients and Adam.
    Step("clt_train", "clt_train.py", "--steps 20",
         "--layers 2 --d-model 16 --features 32 --k 4 --batch 64 --steps 3", 0.04),
    # The whole reduced DAG, 36 jobs (15 on the GPU): one GPU job at a time it was cut at
    # 229 s on an H200 (2026-11-27); 4 side by side, its longest chain of jobs bounds it.
    # Last: it takes the time the steps before it left.
    Step("scale", "scale.py", "--reduced", "--reduced --dry-run", 0.26, out_flag="--out"),
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
    elif device.startswith("cuda"):
        cmd += ["--device", "cuda"]
    else:
        # A dry run of the DAG a lent GPU machine runs (16 cores; planning needs no GPU): its
        # jobs, and the GPUs and threads each asks for.
        cmd += ["--device", "cuda", "--cores", "16"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    log = log_dir / f"{step.name}.log"
    t0, started, cpu0 = time.perf_counter(), time.time(), children_cpu_s()
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
    # Only figures this run wrote: on a GPU `out` may be a committed file of an earlier run.
    fresh = out.is_file() and out.stat().st_mtime >= started - 1
    if status == "ok" and not fresh:
        status = "failed (no result file)"
    return {"step": step.name, "status": status, "wall_s": wall,
            "cpu_s": children_cpu_s() - cpu0, "log": str(log), "command": " ".join(cmd[1:]),
            "figures": fresh}  # fmt: skip


def children_cpu_s() -> float:
    """User and system CPU seconds of the ended processes this one waited for (and theirs)."""
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def stamp(path: Path, env: dict, outcome: dict) -> None:
    """Add what produced the figures to a step's result file (atomically): also to the figures
    a step cut short or failed wrote before it stopped, with its status."""
    from circuitflow.io import write_json

    data = load(path)
    if data is None:
        return
    data["environment"] = env
    data["measure"] = {k: outcome[k] for k in ("command", "wall_s", "cpu_s", "status")}
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


def attribution_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    """This checkout's fast pass beside the code before issue 46 on the same device (the
    second column: no CPU figure is committed for it)."""
    summary = new.get("summary") or {}
    ours, before = summary.get("new") or {}, summary.get("today") or {}
    rows = [
        (
            "attribution (atp): tokens/s (this run: new, before)",
            fmt(ours.get("tokens_per_s")),
            fmt(before.get("tokens_per_s")),
        ),
        (
            "attribution: share of the float32 (no TF32) peak",
            fmt(ours.get("share_of_float32_peak")),
            fmt(before.get("share_of_float32_peak")),
        ),
    ]
    for key in ("syncs_per_batch", "host_copies_per_batch", "decodes_per_batch"):
        rows.append(
            (f"attribution: {key.replace('_', ' ')}", fmt(ours.get(key)), fmt(before.get(key)))
        )
    return rows  # fmt: skip


def capture_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    """Each size's bytes/s and share of the disk's write rate, new beside before."""
    rows = []
    for name, trees in (new.get("summary") or {}).items():
        ours, before = trees.get("new") or {}, trees.get("today") or {}
        rows.append(
            (
                f"capture {name}: MB/s written (new, before)",
                fmt((ours.get("bytes_per_s") or 0) / 1e6 or None),
                fmt((before.get("bytes_per_s") or 0) / 1e6 or None),
            )
        )
        rows.append(
            (
                f"capture {name}: share of the disk's write rate",
                fmt(ours.get("share_of_disk")),
                fmt(before.get("share_of_disk")),
            )
        )
    disk = max(new.get("disk_bytes_per_s") or [0])
    rows.append(("capture: the disk's fsync'd write rate, MB/s", fmt(disk / 1e6 or None), ""))
    return rows  # fmt: skip


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
        gpu = {r: v for r, v in new.get("rules", {}).items() if v["gpus"]}
        threads = max((v["threads"] for v in gpu.values()), default=0)
        return [("scale: DAG planned (dry run)", f"{new['jobs']} jobs", ""),
                (f"scale: GPU jobs planned, {new.get('gpu_jobs_at_a_time')} at a time",
                 f"{sum(v['jobs'] for v in gpu.values())} x {threads} threads", "")]  # fmt: skip
    cpu = cpu or {}
    rows = [("scale: the whole DAG, seconds", fmt(new.get("snakemake_wall_s")),
             fmt(cpu.get("snakemake_wall_s"))),
            ("scale: GPU jobs at a time", fmt(new.get("gpu_jobs_at_a_time")), "")]  # fmt: skip
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


def clt_train_lines(new: dict, cpu: dict | None) -> list[tuple[str, str, str]]:
    shape = new["shape"]
    name = f"clt_train {shape['layers']}x{shape['d_model']}x{shape['features_a_layer']}"
    sync = (new.get("sync_check") or {}).get("passed")
    return [
        (f"{name}: tokens/s", fmt(new.get("tokens_per_s")), "-"),
        (f"{name}: share of peak ({new['compute_dtype']})", fmt(new.get("share_of_peak")), "-"),
        (f"{name}: sync check", "-" if sync is None else str(sync), "-"),
    ]


LINES = {
    "gpu_suite": suite_lines,
    "sae_train": sae_train_lines,
    "sae_stream": sae_stream_lines,
    "attribution": attribution_lines,
    "capture": capture_lines,
    "prompt_graphs": prompt_graph_lines,
    "clt_train": clt_train_lines,
    "scale": scale_lines,
}


# --- issue 46's targets ---------------------------------------------------------------------------
ATTRIBUTION_BEFORE = 2324.2  # tokens/s, attribution "atp, 12 SAEs" on an H200, 2026-11-27


@dataclass(frozen=True)
class Target:
    what: str  # the target, in words
    step: str  # the step whose figures answer it
    figure: Callable[[dict], float | bool | None]  # from that step's result file
    met: Callable[[float | bool], bool]
    unit: str = ""


def _headline(data: dict) -> dict:
    return data["sizes"][data["headline_size"]]


def _one_pass(data: dict) -> float | None:
    """Streaming's SAE-tokens/s when it trained 12 layers in one pass (else None)."""
    if len(data["dimensions"]["saes"]) != 12:
        return None
    return data["paths"]["stream_one_pass"]["tokens_per_s"]


TARGETS = (
    Target("SAE step (gpu trainer, 768 -> 24,576, k 32) >= 1,000,000 tokens/s", "sae_train",
           lambda d: _headline(d).get("gpu_tokens_per_s"), lambda v: v >= 1e6, " tokens/s"),
    Target("SAE step >= 3x SAELens's trainer on the same tokens", "sae_train",
           lambda d: _headline(d).get("gpu_speedup_vs_saelens"), lambda v: v >= 3, "x"),
    Target("SAE step's explained variance within 0.005 of SAELens's", "sae_train",
           lambda d: _headline(d).get("gpu_explained_variance_delta"),
           lambda v: abs(v) <= 0.005),
    Target('gpu step under torch.cuda.set_sync_debug_mode("error")', "sae_train",
           lambda d: _headline(d)["sync_check"]["passed"], lambda v: v is True),
    Target("streaming 12 layers in one pass >= 1,000,000 SAE-tokens/s", "sae_stream",
           _one_pass, lambda v: v >= 1e6, " tokens/s"),
    Target(f"attribution >= 10 x {ATTRIBUTION_BEFORE:,.0f} tokens/s", "attribution",
           lambda d: d["summary"]["new"]["tokens_per_s"],
           lambda v: v >= 10 * ATTRIBUTION_BEFORE, " tokens/s"),
    Target("capture >= 80% of the disk's measured write rate", "capture",
           lambda d: d["summary"]["gpt2"]["new"]["share_of_disk"], lambda v: v >= 0.8),
    Target("the reduced GPT-2-small DAG completes, per-prompt graphs on the device", "scale",
           lambda d: not d.get("dry_run") and "prompt_graphs" in d["stages"],
           lambda v: v is True),
)  # fmt: skip


def judge(outcomes: list[dict], files: dict[str, Path], cuda: bool) -> list[dict]:
    """Each target beside its figure: met, not met, or not measured (the step did not run or
    wrote no such figure). On a CPU the figures are the smoke sizes': nothing is judged."""
    status = {o["step"]: o["status"] for o in outcomes}
    out = []
    for t in TARGETS:
        data = load(files[t.step]) if t.step in files else None
        try:
            value = t.figure(data) if data is not None else None
        except (KeyError, TypeError):
            value = None
        if t.step == "scale" and status.get("scale") != "ok":
            value = False if "scale" in status else None
        if value is None:
            verdict = "not measured"
        elif not cuda:
            verdict = "n/a (CPU smoke sizes)"
        else:
            verdict = "met" if t.met(value) else "NOT MET"
        out.append({"target": t.what, "step": t.step, "figure": value, "verdict": verdict,
                    "unit": t.unit})  # fmt: skip
    return out


def target_lines(judged: list[dict]) -> list[str]:
    width = max(len(j["target"]) for j in judged)
    lines = [f"{'issue 46 target':<{width}}  {'this run':>18}  verdict"]
    for j in judged:
        v = j["figure"]
        shown = "-" if v is None else ("yes" if v is True else "no" if v is False else
                                       fmt(v) + j["unit"])  # fmt: skip
        lines.append(f"{j['target']:<{width}}  {shown:>18}  {j['verdict']}")
    return lines


def screen(outcomes: list[dict], files: dict[str, Path], env: dict, gpu_type: str | None,
           judged: list[dict]) -> str:  # fmt: skip
    label = env.get("gpu") or "CPU (smoke sizes)"
    lines = [f"measured on {label}: torch {env['torch']}, CUDA {env.get('cuda') or '-'}, "
             f"driver {env.get('driver') or '-'}, model dtype {env['compute_dtype']}"]  # fmt: skip
    lines += [f"  {o['step']:<14} {o['status']:<24} {o['wall_s']:6.0f} s, "
              f"{o.get('cpu_s', 0):6.0f} CPU-s" for o in outcomes]  # fmt: skip
    rows: list[tuple[str, str, str]] = []
    for o in outcomes:
        # A step cut short keeps the figures it wrote: shown, marked as such.
        new = load(files[o["step"]]) if o.get("figures") else None
        if new is None:
            continue
        cpu = load(RESULTS / CPU_FILES[o["step"]]) if o["step"] in CPU_FILES else None
        try:
            got = LINES[o["step"]](new, cpu)
            if o["step"] == "gpu_suite" and gpu_type and o["status"] == "ok":
                got += hours_lines(new, cpu, gpu_type)
        except (KeyError, TypeError, ValueError) as err:
            got = [(f"{o['step']}: figures unreadable", f"({type(err).__name__}: {err})", "")]
        mark = "" if o["status"] == "ok" else f" [{o['status']}: figures so far]"
        rows += [(a + mark, b, c) for a, b, c in got]
    width = max([len(r[0]) for r in rows] + [10])
    lines.append(f"{'figure':<{width}}  {'this run':>18}  {'CPU / projection':>18}")
    lines += [f"{a:<{width}}  {b:>18}  {c:>18}" for a, b, c in rows]
    return "\n".join(lines + [""] + target_lines(judged))


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
    p.add_argument("--archive", type=Path, default=None,
                   help="also pack every result file this run wrote, the steps' logs and the "
                   "screen into this .tar.gz (a lent GPU machine's $OUT)")  # fmt: skip
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
                       "log": "", "command": "", "figures": False}  # fmt: skip
        else:
            outcome = run_step(step, device, out, seconds, log_dir)
            if outcome["figures"]:
                stamp(out, env, outcome)
            if outcome["status"] != "ok":
                tail = Path(outcome["log"]).read_text().splitlines()[-15:]
                print("\n".join("    " + x for x in tail), flush=True)
        print(f"    {outcome['status']} in {outcome['wall_s']:.0f} s -> {out.name}", flush=True)
        outcomes.append(outcome)
    judged = judge(outcomes, files, cuda)
    text = screen(outcomes, files, env, gpu_type_of(env.get("gpu", "")) if cuda else None, judged)
    print(text, flush=True)
    summary = out_dir / result_name("measure", device, env)
    write_summary(summary, env, budget, outcomes, judged)
    (log_dir / "screen.txt").write_text(text + "\n")
    if args.archive:
        written = [summary] + [files[o["step"]] for o in outcomes if o["figures"]]
        pack(args.archive, written, log_dir)
    return 0 if all(o["status"] == "ok" for o in outcomes) else 1


def write_summary(path: Path, env: dict, budget: float, outcomes: list[dict],
                  judged: list[dict]) -> None:  # fmt: skip
    """measure-<gpu>-cuda.json: what ran, how each step ended, and the targets beside their
    figures."""
    import datetime

    from circuitflow.io import write_json

    write_json(path, {
        "benchmark": "measure",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": env,
        "budget_s": budget,
        "steps": [{k: o.get(k) for k in ("step", "status", "wall_s", "cpu_s", "command",
                                          "figures")}
                  for o in outcomes],
        "targets": judged,
    })  # fmt: skip


def pack(archive: Path, results: list[Path], log_dir: Path) -> None:
    """`results` under benchmarks/results/ and the logs under logs/ in one .tar.gz: a lent GPU
    machine returns at most 8 files."""
    import tarfile

    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in results:
            tar.add(path, arcname=f"benchmarks/results/{path.name}")
        for path in sorted(log_dir.iterdir()):
            tar.add(path, arcname=f"logs/{path.name}")
    print(f"packed {len(results)} result files and the logs into {archive}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
