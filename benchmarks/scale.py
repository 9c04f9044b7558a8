#!/usr/bin/env python
"""Whole-DAG scale benchmark: every stage of the pipeline through Snakemake on a model of
GPT-2 small's architecture (12 layers, d_model 768, 12 heads, vocabulary 50257) with random
weights, built here as a local Hugging Face directory and loaded by the pipeline's own loading
code, over a corpus generated here (IOI and capital sentences with names, places and countries
drawn at random), with config/gpt2-small.yaml's two behaviours (ioi, capitals).

    python benchmarks/scale.py --device cpu   # reduced counts, 2 SAE layers: < 20 min on 2 cores
    python benchmarks/scale.py --device cuda  # config/gpt2-small.yaml's budgets (one GPU)
    python benchmarks/scale.py --device cuda --reduced   # benchmarks/measure.py's: minutes

`--reduced` (any device) is the CPU mode's counts with a transcoder beside each SAE, so the
per-prompt graphs run too (on a GPU: replacement.compute_rows on CUDA). On a GPU the DAG's
independent jobs share it, `--gpu-jobs` at a time (default 4; the reduced DAG's jobs hold a few
GB of the GPU's memory each and pay 12 to 19 s of start-up, which one at a time were most of its
wall time), each with the machine's cores shared out (`--max-threads`): a stage's seconds are
then those of its jobs beside others', an upper bound on each alone.

Random weights make the science meaningless (accuracies, circuits, faithfulness): this measures
cost only. Writes benchmarks/results/scale-<device>.json: `n_layers`, per stage (capture,
train_sae, attribution, interventions) `wall_s` (Snakemake's benchmark files, summed over the
rule's jobs), `peak_mb` (their largest max_rss), `forward_equivalents_per_prompt` (the stages'
own counts, perf.PassCounter, per the stage's unit) and `a100_hours_full_config`, the A100-hours
a full config/gpt2-small.yaml run would take at the rates measured here (see `projection` in
the JSON for how).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STAGES = ("capture", "train_sae", "attribution", "interventions")
# Figures only, where the run has them (--reduced): not in the projection to a full run.
EXTRA_STAGES = ("prompt_graphs",)
# CPU mode: reduced token and prompt counts and two SAE layers (the first and the last, so
# capture still runs all 12 blocks); every other setting is config/gpt2-small.yaml's.
CPU_OVERRIDES = {
    "layers": [0, 11],
    "capture": {"n_tokens": 4096, "context_length": 32, "checkpoint_tokens": 4096},
    "sae": {"total_tokens": 8192, "batch_size": 1024, "eval_contexts": 8,
            "shuffle_buffer_tokens": 4096, "checkpoint_every_tokens": 8192,
            "dead_window_tokens": 4096},
    "behaviours": {"ioi": {"source": "ioi", "n_prompts": 8},
                   "capitals": {"source": "factual_recall", "n_prompts": 8}},
    "attribution": {"validation_prompts": 4, "validation_features": 8, "validation_heads": 8,
                    "validation_edges": 4, "max_graph_nodes": 10},
    "interventions": {"n_seeds": 1, "n_random_circuits": 1, "n_random_sets": 1,
                      "max_set_size": 2, "steering_alphas": [-4, 0, 4],
                      "circuit_sizes": [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]},
}  # fmt: skip
# --reduced: those counts, and a transcoder at each of the two layers beside its SAE, so the
# DAG also trains transcoders, replaces the MLPs and draws two per-prompt graphs a behaviour.
REDUCED_OVERRIDES = {"sae": {"kind": "both"}, "attribution": {"prompt_graphs": 2}}
# On a CPU the SAEs train in float32: bf16 autocast (the ready configs', for GPUs) is slow there.
CPU_ONLY = {"sae": {"autocast": False}}


def write_model(out: Path, weights: bool = True) -> None:
    """GPT-2 small's architecture with random weights (seed 0) and the byte-level BPE tokenizer
    of .test/tiny-gpt2 (trained there on the prompts' names, places and capitals; ids < 600 of
    the 50257 the embedding holds)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tokenizer = GPT2TokenizerFast.from_pretrained(REPO / ".test" / "tiny-gpt2")
    eos = tokenizer.eos_token_id
    config = GPT2Config(vocab_size=50257, n_positions=1024, n_ctx=1024, n_embd=768, n_layer=12,
                        n_head=12, bos_token_id=eos, eos_token_id=eos)  # fmt: skip
    tokenizer.save_pretrained(out)
    if not weights:  # a dry run reads the architecture only
        config.save_pretrained(out)
        return
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(out, safe_serialization=True)


def write_corpus(out: Path, n_tokens: int, seed: int = 0) -> None:
    """Sentences from the IOI templates and the capitals, names and places drawn at random,
    one a line, until about 1.5 x `n_tokens` tokens (about 10 a sentence)."""
    import random

    from circuitflow.prompts import CAPITALS, IOI_NAMES, IOI_OBJECTS, IOI_PLACES, IOI_TEMPLATES

    rng = random.Random(seed)
    lines = []
    for _ in range(max(100, math.ceil(1.5 * n_tokens / 10))):
        if rng.random() < 0.7:
            a, b = rng.sample(IOI_NAMES, 2)
            line = rng.choice(IOI_TEMPLATES).replace("{A}", a).replace("{B}", b)
            line = line.replace("{PLACE}", rng.choice(IOI_PLACES))
            line = line.replace("{OBJECT}", rng.choice(IOI_OBJECTS)) + f" {a}"
        else:
            country, city = rng.choice(list(CAPITALS.items()))
            line = f"The capital of {country} is the city of {city}"
        lines.append(line)
    out.write_text("\n".join(lines) + "\n")


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_config(
    device: str, workdir: Path, model_dir: Path, corpus: Path, reduced: bool = False
) -> dict:
    """config/gpt2-small.yaml on the local model and corpus; on CPU (or `reduced`, as
    benchmarks/measure.py runs it on a GPU within minutes) with CPU_OVERRIDES."""
    config = yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text())
    config = merge(config, {
        "outdir": str(workdir / "results"),
        "device": device,
        "model": {"name": str(model_dir), "dtype": "auto", "hf_cache": None},
        "capture": {"corpus": str(corpus)},
        # The capture path at the budget this benchmark was made for (the ready config now
        # streams 300M tokens a layer: benchmarks/sae_stream.py measures streaming).
        "sae": {"source": "capture", "total_tokens": 20_000_000},
    })  # fmt: skip
    config["model"].pop("n_layers", None)  # read from the local config.json
    if reduced:
        config = merge(merge(config, CPU_OVERRIDES), REDUCED_OVERRIDES)
    elif device == "cpu":
        config = merge(config, CPU_OVERRIDES)
    return merge(config, CPU_ONLY) if device == "cpu" else config


def snakemake_command(config_file: Path, cores: int, gpu_jobs: int, dry_run: bool = False) -> list:
    """Snakemake on the DAG: at most `gpu_jobs` GPU jobs at a time (`--resources gpus=N`: each
    GPU rule asks for one; 0 on a CPU, whose rules ask for none), each with at most an even
    share of the cores (`--max-threads`: the GPU rules ask for 8). The greedy scheduler: the
    ILP one's solver (pulp's CBC) is left out of the wheels a GPU machine without network gets
    (benchmarks/device_wheels.py), and on a DAG this small the order hardly matters."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(REPO), "--configfile", str(config_file), "--cores", str(cores),
           "--resources", f"gpus={gpu_jobs}", "--scheduler", "greedy"]  # fmt: skip
    if gpu_jobs > 1:
        cmd += ["--max-threads", str(max(1, cores // gpu_jobs))]
    return cmd + (["--dry-run"] if dry_run else [])


def snakemake(config_file: Path, cores: int, gpu_jobs: int, dry_run: bool = False) -> float:
    """Run the DAG (snakemake_command); `dry_run`: plan it only (benchmarks/measure.py's CPU
    smoke test)."""
    cmd = snakemake_command(config_file, cores, gpu_jobs, dry_run)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}
    log = config_file.parent / "snakemake.log"
    t0 = time.perf_counter()
    # The whole log to the file; the progress lines also here, so a run cut short (as
    # benchmarks/measure.py cuts a step at its share of the time) shows how far it got.
    with (
        log.open("w") as f,
        subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
        ) as p,
    ):
        for line in p.stdout:
            f.write(line)
            if " steps (" in line or line.startswith(("Finished jobid", "Error in rule")):
                print(f"{time.perf_counter() - t0:6.0f} s  {line.rstrip()}", flush=True)
    if p.returncode != 0:
        sys.exit(f"snakemake failed ({p.returncode}); see {log}")
    return time.perf_counter() - t0


def elapsed_s(log: Path) -> float:
    """Snakemake's `Elapsed time: H:MM:SS.f` at the end of a finished run's log."""
    line = next(x for x in reversed(log.read_text().splitlines()) if x.startswith("Elapsed time"))
    h, m, sec = line.split(": ", 1)[1].split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


# --- what the run measured ------------------------------------------------------------------------
def rule_costs(results: Path, rule: str) -> dict:
    """Wall time (summed over the rule's jobs) and peak max_rss of one rule's benchmark files."""
    from circuitflow.report.job_costs import read_benchmark

    bench = results / "benchmarks"
    paths = [bench / f"{rule}.tsv", *sorted((bench / rule).glob("*.tsv"))]
    rows = [read_benchmark(p) for p in paths if p.is_file()]
    rows = [r for p, r in zip(paths, rows, strict=False) if p.stem != "across"]
    return {"jobs": len(rows), "wall_s": sum(float(r["s"]) for r in rows),
            "peak_mb": max(float(r["max_rss"]) for r in rows)}  # fmt: skip


def planned_peak_mb(config: dict, rule: str, device: str) -> float:
    """The host memory the resource plan gives one job of `rule` (circuitflow.resources, before
    Slurm's headroom), for the measured max_rss beside it."""
    from circuitflow import config as cf_config
    from circuitflow import resources

    resolved = cf_config.resolve(config)
    return resources.job_peak_bytes(resolved, rule, device) / 2**20


def dag_jobs(log: Path) -> int:
    """The `total` of the job table a dry run prints."""
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total" and parts[1].isdigit():
            return int(parts[1])
    raise ValueError(f"{log}: no job table (did the dry run fail?)")


def planned_jobs(log: Path) -> dict[str, dict]:
    """Per rule of a dry run's log: its jobs, the GPUs and the threads each asks for."""
    import re

    rules: dict[str, dict] = {}
    for block in log.read_text().split("\n\n"):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        if not rule:
            continue
        gpus = re.search(r"^\s+resources:.*\bgpus=(\d+)", block, re.M)
        threads = re.search(r"^\s+threads: (\d+)", block, re.M)
        row = rules.setdefault(rule.group(1), {"jobs": 0, "gpus": 0, "threads": 1})
        row["jobs"] += 1
        row["gpus"] = max(row["gpus"], int(gpus.group(1)) if gpus else 0)
        row["threads"] = max(row["threads"], int(threads.group(1)) if threads else 1)
    return rules


def stage_summaries(results: Path, rule: str) -> list[dict]:
    """Each job's counted cost (perf.PassCounter.summary) and what else the projection needs."""
    if rule == "capture":
        import h5py

        out = []
        for path in sorted(results.glob("activations/*/layer_*.h5"))[:1]:
            with h5py.File(path, "r") as f:
                out.append({k: (v.item() if hasattr(v, "item") else str(v))
                            for k, v in f.attrs.items() if k.startswith("forward_")
                            or k in ("context_length", "n_tokens", "context_start",
                                     "context_stop")})  # fmt: skip
        return out
    pattern = {"train_sae": "saes/*/layer_*/metrics.json",
               "attribution": "attribution/*/summary.json",
               "prompt_graphs": "attribution/*/prompt_graphs/summary.json",
               "interventions": "interventions/*/summary.json"}[rule]  # fmt: skip
    return [json.loads(p.read_text()) for p in sorted(results.glob(pattern))]


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


# --- the projection to a full config/gpt2-small.yaml run on A100s ---------------------------------
def projection(stages: dict, run_cfg: dict, device_peak: float) -> tuple[dict, str]:
    """A100-hours of a full config/gpt2-small.yaml run per stage, from this run's wall times.

    Per stage: A100 seconds = this run's wall_s x (FLOPs of the full run / FLOPs of this run) x
    (this device's peak / the A100's peak for the stage's dtype: bf16 312 TFLOP/s for the model
    stages, TF32 156 for SAE training): the stage is assumed to reach the same share of the
    A100's peak as it reached of this device's (report/gpu_hours.py's roofline projection).
    FLOPs are counted passes x FLOPs of a pass (perf): capture contexts x forward equivalents;
    SAE training tokens x 12 d_in d_sae plus the evaluation's passes; attribution's passes from
    attribution_plan.passes (the planner's formula, tested against the stage's own count) for
    the full config's prompts, this run's measured count for this run; interventions this run's
    passes per prompt (the same settings but seeds, random controls and circuit sizes on CPU)
    x the full prompts. Start-up (loading, imports) is charged at the same rate: on a short CPU
    run it inflates the projection (conservative).
    """
    from circuitflow import perf
    from circuitflow.attribution import plan as attribution_plan
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.model import architectures
    from circuitflow.model.flops import (
        attribution_forward_flops_per_prompt,
        forward_flops_per_token,
    )

    arch = architectures.config("gpt2-small")
    from circuitflow import config as cf_config

    # The full run's config as the pipeline resolves it (the schema's defaults filled in).
    full = cf_config.resolve(yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text()))
    full["sae"] |= {"source": "capture", "total_tokens": 20_000_000}  # as run_config
    full_hooks = arch.n_layers * len(full["sites"])
    a100 = perf.NOMINAL_PEAK_FLOPS["A100"]
    run_hooks = len(run_cfg["layers"]) * len(run_cfg["sites"])
    out = {}

    def ctx_flops(t: int, unembed: bool = True) -> float:
        return t * forward_flops_per_token(arch, t, unembed=unembed)

    # capture: one forward (capture's count per context) of every context.
    cap = stages["capture"]
    t = int(cap["context_length"])
    run_flops = cap["forward_equivalents_total"] * ctx_flops(t, unembed=False)
    t_full = int(full["capture"]["context_length"])
    contexts_full = math.ceil(full["capture"]["n_tokens"] / (t_full - 1))
    full_flops = contexts_full * cap["forward_equivalents_per_prompt"] * ctx_flops(t_full, False)
    out["capture"] = (run_flops, full_flops, a100["bfloat16"])

    # train_sae: the SAE's tokens and the evaluation's passes (eval contexts of the capture's t).
    sae = stages["train_sae"]
    d_sae = lambda cfg: cfg["sae"].get("d_sae") or cfg["sae"]["expansion_factor"] * 768  # noqa: E731
    sae_full = full["sae"]
    per_token = perf.sae_training_flops_per_token
    run_flops = sae["tokens_trained_total"] * per_token(768, d_sae(run_cfg)) + sae[
        "forward_equivalents_total"
    ] * ctx_flops(t)
    full_flops = full_hooks * (
        sae_full["total_tokens"] * per_token(768, d_sae({"sae": sae_full}))
        + sae["forward_equivalents_per_prompt"] * sae_full["eval_contexts"] * ctx_flops(t_full)
    )
    out["train_sae"] = (run_flops, full_flops, a100["float32"])

    # attribution: passes x a spliced pass of a prompt (every SAE in).
    att = stages["attribution"]
    plen = att["prompt_length"]
    spliced = lambda n, ds: attribution_forward_flops_per_prompt(arch, plen, n, ds)  # noqa: E731
    run_flops = att["forward_equivalents_total"] * spliced(run_hooks, d_sae(run_cfg))
    acfg = AttributionConfig.from_dict(full["attribution"])
    full_flops = 0.0
    for b in full["behaviours"].values():
        n = b["n_prompts"]
        passes = attribution_plan.passes(arch, full_hooks, acfg, n, d_sae(full))
        full_flops += n * sum(passes.values()) * spliced(full_hooks, d_sae(full))
    out["attribution"] = (run_flops, full_flops, a100["bfloat16"])

    # interventions: forward passes of a prompt (plain model; SAE features spliced where steered).
    iv = stages["interventions"]
    run_flops = iv["forward_equivalents_total"] * ctx_flops(plen)
    n_full = sum(b["n_prompts"] for b in full["behaviours"].values())
    full_flops = n_full * iv["forward_equivalents_per_prompt"] * ctx_flops(plen)
    out["interventions"] = (run_flops, full_flops, a100["bfloat16"])

    hours = {}
    for rule, (run_flops, full_flops, peak) in out.items():
        scale = full_flops / run_flops if run_flops else float("nan")
        hours[rule] = stages[rule]["wall_s"] * scale * device_peak / peak / 3600
    return hours, projection.__doc__.split("\n\n", 1)[1].strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--workdir", type=Path, default=None, help="default: a fresh temp directory")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--reduced",
        action="store_true",
        help="the CPU's reduced counts on any device (benchmarks/measure.py)",
    )
    ap.add_argument("--gpu-jobs", type=int, default=None,
                    help="GPU jobs at a time on the one GPU (default: 4 with --reduced on a GPU, "
                    "else 1, so a full run's jobs each have the GPU alone)")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true",
                    help="plan the DAG only and write its job count (a smoke test)")  # fmt: skip
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="read a finished run in --workdir (its snakemake.log's elapsed time) instead of "
        "running the DAG again",
    )
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import tempfile

    import torch

    from circuitflow import perf
    from circuitflow.io import write_json

    if args.gpu_jobs is None:
        args.gpu_jobs = 4 if args.reduced and args.device == "cuda" else 1
    gpu_jobs = args.gpu_jobs if args.device == "cuda" else 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="circuitflow-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir, corpus = workdir / "gpt2-small-random", workdir / "corpus.txt"
    if not (model_dir / "config.json").is_file():
        write_model(model_dir, weights=not args.dry_run)
    config = run_config(args.device, workdir, model_dir, corpus, args.reduced)
    if not args.reuse:
        write_corpus(corpus, int(1.2 * config["capture"]["n_tokens"]) + 10_000)
    config_file = workdir / "config.yaml"
    if not args.reuse:
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    path = args.out or REPO / "benchmarks" / "results" / f"scale-{args.device}.json"
    if args.dry_run:
        snakemake(config_file, args.cores, gpu_jobs, dry_run=True)
        jobs = dag_jobs(workdir / "snakemake.log")
        rules = planned_jobs(workdir / "snakemake.log")
        write_json(
            path,
            {
                "benchmark": "scale",
                "dry_run": True,
                "jobs": jobs,
                "device": args.device,
                "cores": args.cores,
                "gpu_jobs_at_a_time": gpu_jobs,
                "command": snakemake_command(config_file, args.cores, gpu_jobs)[1:],
                "rules": rules,
                "config": {k: config[k] for k in ("layers", "sae", "behaviours")},
            },
        )
        print(f"scale: dry run of {jobs} jobs; wrote {path}")
        return
    if args.reuse:
        total_s = elapsed_s(workdir / "snakemake.log")
    else:
        total_s = snakemake(config_file, args.cores, gpu_jobs)

    results = workdir / "results"
    stages = {}
    ran = [r for r in EXTRA_STAGES if (results / "benchmarks" / r).is_dir()]
    for rule in (*STAGES, *ran):
        summaries = stage_summaries(results, rule)
        stage = rule_costs(results, rule)
        stage["forward_equivalents_per_prompt"] = mean(
            s.get("forward_equivalents_per_prompt") for s in summaries
        )
        stage["forward_equivalents_unit"] = summaries[0].get("forward_equivalents_unit")
        stage["forward_equivalents_total"] = sum(
            s.get("forward_equivalents_total", 0.0) for s in summaries
        )
        units = sum(
            s["forward_equivalents_total"] / s["forward_equivalents_per_prompt"]
            for s in summaries
            if s.get("forward_equivalents_per_prompt")
        )
        stage["units"] = units
        stage["seconds_per_unit"] = stage["wall_s"] / units if units else None
        try:
            stage["planned_peak_mb"] = planned_peak_mb(config, rule, args.device)
        except Exception as err:  # a figure beside the measurement: never lose the run for it
            stage["planned_peak_mb"] = None
            stage["planned_peak_error"] = f"{type(err).__name__}: {err}"
        stages[rule] = stage
    stages["capture"]["context_length"] = config["capture"]["context_length"] or 128
    stages["train_sae"]["tokens_trained_total"] = sum(
        s["tokens_trained"] for s in stage_summaries(results, "train_sae")
    )
    prompts = yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text())
    import pandas as pd

    lengths = [
        len(t)
        for b in prompts["behaviours"]
        for t in pd.read_parquet(results / "prompts" / f"{b}.parquet")["clean_tokens"]
    ]
    stages["attribution"]["prompt_length"] = round(sum(lengths) / len(lengths))

    if args.device == "cuda":
        name = torch.cuda.get_device_name()
        peak = perf.nominal_peak_flops(name, "bfloat16") or perf.measured_peak_flops("cuda")
        device = {"type": "cuda", "name": name}
    else:
        torch.set_num_threads(args.cores)
        peak = perf.measured_peak_flops("cpu")
        device = {"type": "cpu", "threads": args.cores}
    hours, how = projection(stages, config, peak)
    for rule, h in hours.items():
        stages[rule]["a100_hours_full_config"] = h
    out = {
        "benchmark": "scale",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "device": device | {"peak_flops": peak, "torch": torch.__version__},
        "n_layers": 12,
        "model": "gpt2-small architecture, random weights (local Hugging Face directory)",
        "config": {k: config[k] for k in ("layers", "capture", "sae", "behaviours")},
        "reduced": args.device == "cpu" or args.reduced,
        "gpu_jobs_at_a_time": gpu_jobs,
        "snakemake_wall_s": total_s,
        "stages": stages,
        "a100_hours_full_config": sum(hours.values()),
        "projection": how,
    }
    write_json(path, out)
    print(json.dumps(out, indent=2))
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
