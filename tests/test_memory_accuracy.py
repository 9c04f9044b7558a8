"""The memory planner against measured peaks: each stage's real work on CPU (capture with
TransformerLens and the HDF5 writer, SAE training with the fast trainer and SAELens's,
attribution with spliced SAEs, both real architectures at 2 layers), measured in a fresh process
by tests/helpers/memory_probe.py, must come within 20% of the planner's estimate; the streaming
SAE job (model, shuffle buffers, the group's SAEs and Adam state, refilling forward passes) too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).parent / "helpers" / "memory_probe.py"
CASES = {
    ("capture", "gpt2-small"),
    ("capture", "qwen2.5-0.5b"),
    ("sae_train", "topk"),  # the fast trainer, as the stage runs it
    ("sae_train", "batchtopk"),
    ("sae_train", "topk saelens"),
    ("sae_train", "standard"),
    ("sae_train", "topk transcoder"),  # mlp_in and mlp_out read in lockstep
    ("sae_train", "topk gpu"),  # sae.stacked's trainer (AuxK on in its last step)
    ("sae_train", "batchtopk gpu"),
    ("sae_stream", "gpt2-small"),  # two layers' SAEs from one stream of forward passes
    ("sae_stream", "gpt2-small transcoder"),  # two transcoders: four hooks a pass
    ("attribution", "gpt2-small atp"),
    ("attribution", "qwen2.5-0.5b atp"),
    ("attribution", "gpt2-small ig"),
}


@pytest.fixture(scope="module")
def measured():
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the resident-set peak")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    # A bound, not a target: the probes take ~105 CPU-s, and 250 s of wall beside the suite's
    # other workers on a slow day (300 s timed out every case at once).
    done = subprocess.run(
        [sys.executable, str(PROBE)], capture_output=True, text=True, timeout=900, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if any("skip" in r for r in records):
        pytest.skip(records[0]["skip"])
    return {(r["stage"], r["case"]): r for r in records}


def test_every_stage_was_measured(measured):
    assert set(measured) == CASES
    for r in measured.values():
        # Large enough that tensors, not allocator noise, make the peak (the gpu trainer's
        # lean step measures about 90 MiB at the probe's size).
        assert r["measured"] > 80 * 2**20, r


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def test_estimate_within_20_percent_of_measured_peak(measured, case):
    r = measured[case]
    ratio = r["planned"] / r["measured"]
    assert 0.8 <= ratio <= 1.2, (
        f"{case}: planned {r['planned'] / 2**20:.0f} MiB, "
        f"measured {r['measured'] / 2**20:.0f} MiB (ratio {ratio:.2f})"
    )


# --- whole jobs: each default-DAG job's plan against its measured max_rss -------------------------
def _job_rule(path: Path, bench: Path) -> str:
    rel = path.relative_to(bench).with_suffix("")
    rule = rel.parts[0]
    return "interventions_across" if rel.parts[1:] == ("across",) else rule


def _job_peak_mb(path: Path, results: Path) -> float:
    """The job's peak in MiB: its benchmark file's max_rss (sampled: every 30 s after 15 s)
    or, where larger, the exact ru_maxrss the stage script logs on success (cli.main)."""
    import re

    from circuitflow.report.job_costs import read_benchmark

    rel = path.relative_to(results / "benchmarks").with_suffix(".log")
    log = results / "logs" / rel  # the report's rules log under logs/report/
    if rel.parts[0].startswith("report_") or rel.parts[0] in ("job_costs.log", "sae_summary.log"):
        name = Path(*rel.parts[1:]) if len(rel.parts) > 1 else rel.name.removeprefix("report_")
        if rel.parts[0] == "report_features_dictionary":  # a dictionary's page
            name = Path("features", name)
        log = results / "logs" / "report" / name
    peak = float(read_benchmark(path)["max_rss"])
    if log.is_file():
        found = re.findall(r"peak resident memory: ([\d.]+) MiB", log.read_text())
        peak = max([peak, *(float(f) for f in found)])
    return peak


def test_runtime_constants_match_a_fresh_interpreter():
    """RUNTIME_MB (the libraries a job imports) is measured, not guessed: re-measure it."""
    from circuitflow import memory

    off = []
    for kind in memory.RUNTIME_MODULES:
        measured = memory.measure_runtime_bytes(kind) / memory.MiB
        # Upper values (a fresh install's): aged page-cache state measures up to ~25% less
        # (transformers' many small files: 134 against 178 MiB).
        if not 0.95 <= memory.RUNTIME_MB[kind] / measured <= 1.4:
            off.append(f"{kind}: planned {memory.RUNTIME_MB[kind]} MiB, measured {measured:.0f}")
    assert not off, "\n".join(off)  # every kind at once: CI's first miss hid the later ones


def test_a_job_peak_does_not_inherit_its_parents():
    """Linux carries a parent's ru_maxrss across fork and exec: a job started by a large process
    (pytest, Snakemake) must still report its own peak."""
    import numpy as np

    from circuitflow import memory

    ballast = np.ones(96 * memory.MiB)  # 768 MiB resident in this process
    measured = memory.measure_runtime_bytes("base") / memory.MiB
    assert ballast.sum() > 0 and 0.95 <= memory.RUNTIME_MB["base"] / measured <= 1.3, measured


def test_every_default_job_plan_within_25_percent_of_its_peak(default_results):
    """resources.job_peak_bytes (what resources.mem_mb asks Slurm for, less its headroom): the
    interpreter and libraries included, within 25% of every job's max_rss in the default run."""
    import yaml
    from helpers.dag import REPO

    from circuitflow import config as cf_config
    from circuitflow import resources

    config = cf_config.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    bench = default_results / "benchmarks"
    checked, off, short = set(), [], []
    for path in sorted(bench.rglob("*.tsv")):
        rule = _job_rule(path, bench)
        measured = _job_peak_mb(path, default_results)
        # train_sae plans each job by its site (an SAE, or at mlp_out a transcoder), a
        # dictionary's page of the feature browser by its dictionary (site.layer).
        job = path.stem.rsplit("_layer_", 1)[0] if rule == "train_sae" else None
        if rule == "report_features_dictionary":
            job = ".".join(path.stem.rsplit("_layer_", 1))
        planned = resources.job_peak_bytes(config, rule, "cpu", job) / 2**20
        checked.add(rule)
        if not 0.75 <= planned / measured <= 1.25:
            off.append(
                f"{path.relative_to(bench)}: planned {planned:.0f} MB, max_rss {measured:.0f}"
            )
        requested = resources.mem_mb(config | {"device": "cpu"}, rule, 1, job)
        if requested < measured:
            name = path.relative_to(bench)
            short.append(f"{name}: requested {requested} MB, max_rss {measured:.0f}")
    # Every job's figures at once: a run's jobs are checked together, not to the first miss.
    assert not short and not off, "\n".join(["requested below the peak:", *short, "off:", *off])
    assert {"train_model", "baseline", "capture", "train_sae", "attribution", "interventions",
            "job_costs"} <= checked  # fmt: skip
