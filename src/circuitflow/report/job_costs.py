"""Cost of every job from Snakemake's benchmark files (`benchmarks/**.tsv`).

A benchmark TSV has one row per repeat with columns `s`, `h:m:s`, `max_rss`, `max_vms`,
`max_uss`, `max_pss` (MB), `io_in`, `io_out` (MB), `mean_load` (%), `cpu_time` (s). The rule is
the file's first path component under `benchmarks/`; the rest names the job (`{behaviour}`,
`{site}_layer_{layer}`, `shard_{n}`). GPU-hours are wall time x GPUs for jobs that ran on a GPU
(the rules in `resources.GPU_RULES` when the run's environment saw CUDA); the GPU's peak memory
comes from the SAE metrics, the stage that records it. The GPU stages' counted cost
(`forward_equivalents_per_prompt`, per the unit in `forward_equivalents_unit`) comes from their
summaries: baseline and attribution and interventions per prompt, capture per context (its HDF5
attrs), train_sae per evaluation context (its metrics.json).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from circuitflow import resources
from circuitflow.nodes import SITES

NUMERIC = ["s", "max_rss", "max_vms", "max_uss", "max_pss", "io_in", "io_out", "mean_load",
           "cpu_time"]  # fmt: skip
COLUMNS = [
    "rule", "job", "site", "layer", "behaviour", "wall_s", "wall_hms", "max_rss_mb",
    "max_uss_mb", "cpu_time_s", "mean_load", "io_in_mb", "io_out_mb", "gpus", "gpu_hours",
    "gpu_peak_memory_mb", "forward_equivalents_per_prompt", "forward_equivalents_unit",
]  # fmt: skip
# Where each GPU stage records its counted cost (perf.PassCounter.summary), by job name.
COST_FILES = {
    "baseline": "baseline/{job}.json",
    "train_sae": "saes/{site}/layer_{layer}/metrics.json",
    "pretrained_sae": "saes/{site}/layer_{layer}/metrics.json",
    # A streaming job trains a group: its first member's metrics (the job's name starts with it).
    "train_sae_stream": "saes/{site}/layer_{layer}/metrics.json",
    "attribution": "attribution/{job}/summary.json",
    "interventions": "interventions/{job}/summary.json",
}


# The rules that write saes/ and their metrics.json.
SAE_RULES = ("train_sae", "pretrained_sae", "train_sae_stream")


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def read_benchmark(path: Path | str) -> dict:
    """The last row of one benchmark TSV (the one that produced the output) as numbers."""
    frame = pd.read_csv(path, sep="\t")
    if frame.empty:
        raise ValueError(f"benchmark file {path} has no rows")
    row = frame.iloc[-1]
    return {c: pd.to_numeric(row.get(c), errors="coerce") for c in NUMERIC}


def stage_cost(root: Path, rule: str, job: str, site: str | None, layer: int | None) -> dict:
    """A job's `forward_equivalents_per_prompt` and its unit from its stage's summary ({} when
    the rule counts none, or its summary has no count)."""
    keys = ("forward_equivalents_per_prompt", "forward_equivalents_unit")
    if rule in ("capture", "capture_shard"):  # every file of the capture carries its cost
        import h5py

        for path in sorted(root.glob("activations/*/layer_*.h5")):
            with h5py.File(path, "r") as f:
                return {k: f.attrs[k].item() if k != keys[1] else str(f.attrs[k])
                        for k in keys if k in f.attrs}  # fmt: skip
        return {}
    if rule == "features":
        return _features_cost(root, job)
    if rule not in COST_FILES:
        return {}
    path = root / COST_FILES[rule].format(job=job, site=site, layer=layer)
    if not path.is_file():
        return {}
    summary = json.loads(path.read_text())
    return {k: summary[k] for k in keys if k in summary}


def _features_cost(root: Path, job: str) -> dict:
    """A features job's cost: the sum of its dictionaries' shares (each summary.json holds its
    own, and names the job's members)."""
    from circuitflow.features.plan import FeatureGroup

    shares, unit = [], None
    for path in sorted(root.glob("features/*/layer_*/summary.json")):
        summary = json.loads(path.read_text())
        members = summary.get("job_members")
        if members and FeatureGroup.parse(",".join(members)).name == job:
            shares.append(summary["forward_equivalents_per_prompt"])
            unit = summary.get("forward_equivalents_unit")
    if not shares:
        return {}
    return {"forward_equivalents_per_prompt": sum(shares), "forward_equivalents_unit": unit}


def job_costs(
    outdir: Path | str, config: dict, behaviours: list[str], gpu_seen: bool
) -> pd.DataFrame:
    """One row per benchmarked job, with GPU-hours where a GPU ran."""
    root = Path(outdir)
    bench = root / "benchmarks"
    sae_gpu_mem = {}
    for path in root.glob("saes/*/layer_*/metrics.json"):
        metrics = json.loads(path.read_text())
        if str(metrics.get("device", "")).startswith("cuda"):
            sae_gpu_mem[f"{metrics['site']}_layer_{metrics['layer']}"] = metrics["peak_memory_mb"]
    rows = []
    for path in sorted(bench.rglob("*.tsv")):
        rel = path.relative_to(bench).with_suffix("")
        if rel.parts == ("job_costs",):
            continue  # this job itself, from an earlier run
        rule = rel.parts[0]
        job = "/".join(rel.parts[1:]) or rule
        numbers = read_benchmark(path)
        layer = re.search(r"layer_(\d+)", job)
        site = next((s for s in SITES if job.startswith(f"{s}_")), None)  # a dictionary's job
        behaviour = job if job in behaviours else None
        gpus = resources.gpus(config, rule) if gpu_seen else 0
        layer = int(layer.group(1)) if layer else None
        rows.append(
            {
                "rule": rule,
                "job": job,
                "site": site,
                "layer": layer,
                "behaviour": behaviour,
                "wall_s": numbers["s"],
                "wall_hms": _hms(numbers["s"]),
                "max_rss_mb": numbers["max_rss"],
                "max_uss_mb": numbers["max_uss"],
                "cpu_time_s": numbers["cpu_time"],
                "mean_load": numbers["mean_load"],
                "io_in_mb": numbers["io_in"],
                "io_out_mb": numbers["io_out"],
                "gpus": gpus,
                "gpu_hours": numbers["s"] * gpus / 3600,
                "gpu_peak_memory_mb": (
                    sae_gpu_mem.get(f"{site}_layer_{layer}") if rule in SAE_RULES else None
                ),
                **stage_cost(root, rule, job, site, layer),
            }
        )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({"layer": "Int64"})


def per_rule(costs: pd.DataFrame) -> pd.DataFrame:
    """Totals per rule: jobs, wall time (sum, max), peak memory, CPU time, GPU-hours."""
    if costs.empty:
        return pd.DataFrame(columns=["rule", "jobs", "wall_s_total", "wall_s_max",
                                     "max_rss_mb", "cpu_time_s", "gpu_hours",
                                     "forward_equivalents_per_prompt",
                                     "forward_equivalents_unit"])  # fmt: skip
    grouped = costs.groupby("rule", sort=False)
    out = pd.DataFrame(
        {
            "jobs": grouped.size(),
            "wall_s_total": grouped["wall_s"].sum(),
            "wall_s_max": grouped["wall_s"].max(),
            "max_rss_mb": grouped["max_rss_mb"].max(),
            "cpu_time_s": grouped["cpu_time_s"].sum(),
            "gpu_hours": grouped["gpu_hours"].sum(),
            # Mean over the rule's jobs, per the rule's unit (prompt, context).
            "forward_equivalents_per_prompt": grouped["forward_equivalents_per_prompt"].mean(),
            "forward_equivalents_unit": grouped["forward_equivalents_unit"].first(),
        }
    ).reset_index()
    total = {
        "rule": "total",
        "jobs": out["jobs"].sum(),
        "wall_s_total": out["wall_s_total"].sum(),
        "wall_s_max": out["wall_s_max"].max(),
        "max_rss_mb": out["max_rss_mb"].max(),
        "cpu_time_s": out["cpu_time_s"].sum(),
        "gpu_hours": out["gpu_hours"].sum(),
    }
    return pd.concat([out, pd.DataFrame([total])], ignore_index=True)


def plot(costs: pd.DataFrame):
    """Wall time and peak memory per job, coloured by rule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = costs.sort_values("wall_s", ascending=True)
    pairs = zip(costs["rule"], costs["job"], strict=True)
    labels = [r if r == j else f"{r}: {j}" for r, j in pairs]
    rules = list(dict.fromkeys(costs["rule"]))
    cmap = plt.get_cmap("tab10")
    colours = [cmap(rules.index(r) % 10) for r in costs["rule"]]
    height = max(3.0, 0.28 * len(costs) + 1.2)
    panels = 3 if costs["gpu_hours"].fillna(0).sum() > 0 else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels + 2, height), sharey=True)
    axes[0].barh(labels, costs["wall_s"], color=colours)
    axes[0].set(title="wall time", xlabel="seconds")
    axes[1].barh(labels, costs["max_rss_mb"], color=colours)
    axes[1].set(title="peak host memory (max RSS)", xlabel="MB")
    if panels == 3:
        axes[2].barh(labels, costs["gpu_hours"], color=colours)
        axes[2].set(title="GPU-hours", xlabel="GPU-hours")
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Cost of every job ({len(costs)} jobs, {costs['wall_s'].sum():.0f} s in total)")
    fig.tight_layout()
    return fig
