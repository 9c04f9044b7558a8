"""GPU-hours of a full run, from the rates the GPU suite measured (benchmarks/gpu_suite.py).

Every row counts its jobs' work by the plans the Slurm walltimes read (`resources.job_work`:
each stage's `<stage>/plan.py`, baseline_plan.py; `planned_rows` lists the jobs as the workflow
schedules them), so the table differs from the walltime plan only in the rate it applies: each
part of a job's work (its FLOPs by dtype, perf.Work) runs at the rate the suite measured for the
stage that stands for it (circuitflow.measured.RULE_STAGES, as the walltimes read measured
rates), instead of a share of the datasheet peak. For a model the suite covers (GPT-2 small,
Qwen2.5-0.5B):

- capture: a forward pass of every context through the deepest captured layer, every hook's rows
  written, at the suite's capture rate;
- train_sae (one job per dictionary), train_sae_stream (one per group of sites and layers,
  stream_groups.stream_groups) and transcoder_replacement: the SAE's training rows and its
  evaluation at the suite's rate for that SAE (its variant when one matches the config's
  architecture, width and k; otherwise the widest variant's FLOP rate), the stream's forward
  passes at the capture rate;
- pretrained_sae (grouped as streaming groups them): each published dictionary's evaluation at
  the suite's forward rate;
- baseline, attribution, prompt_graphs and interventions, per behaviour, over prompts of the
  planned length (memory.PLANNED_PROMPT_LENGTH, 32 tokens for a real model: the walltimes' upper
  bound, where the real IOI and capitals prompts have 16 to 20): the model stages at the suite's
  forward rate, attribution and the per-prompt graphs at its attribution rate (measured on
  16-token prompts);
- features, one job a group of layers: the pass over features.n_tokens tokens and every
  member's encoding.

Every dictionary is counted at its own width (circuitflow.description: a published one's
cfg.json, else the config's).

When the suite ran on the target GPU (an A100 by default) the hours are measured. Otherwise
they are projected: the stage is assumed to reach the same share of the target's datasheet peak
for the work's dtype (bf16 312 TFLOP/s for the model, TF32 156 for the fp32 SAE on an A100) as it
reached of the measured device's peak (its roofline share), and the capture cannot write faster
than the disk the suite measured. From a CPU result that is a projection, not a measurement: GPU
kernels, memory bandwidth and launch overheads behave differently, so the figures are labelled
as such.
Per-job start-up (imports, loading the model) is left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitflow import description, dictionary_sources, measured, perf, resources, sites
from circuitflow.cluster import Cluster
from circuitflow.errors import InputError
from circuitflow.model import architectures

if TYPE_CHECKING:  # pandas only for the table: the workflow reads suite_files in every invocation
    import pandas as pd

A100 = "A100"  # CSD3's GPU, the default target (a profile's `gpu_type` names another)
TARGET_A100_HOURS = 10.0  # the project's aim for a full Qwen2.5-0.5B run
# The rules whose disk bytes are writes, which a projection bounds by the disk write speed the
# suite measured (the others read, at rates its stages measured with their reads in them).
WRITES = frozenset({"capture", "capture_shard"})


def load_suite(path: Path | str) -> dict:
    """A result file of benchmarks/gpu_suite.py."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not a readable gpu_suite result ({err})") from None
    if "results" not in data or "device" not in data:
        raise InputError(f"{path}: not a gpu_suite result file (no 'results'/'device')")
    return data


def suite_files(folder: Path | str) -> list[str]:
    """The gpu_suite result files among benchmarks/results/*.json: the other benchmarks write
    there too (sae_train-<device>.json, scale-<device>.json, faults.json)."""

    def other_benchmark(path: Path) -> bool:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return False  # kept: load_suite refuses it in one line
        return not (isinstance(data, dict) and "suite" in data)

    return [str(p) for p in sorted(Path(folder).glob("*.json")) if not other_benchmark(p)]


def measured_on(suite: dict, gpu: str = A100) -> bool:
    """The suite ran on a `gpu` (a key of perf.NOMINAL_PEAK_FLOPS, matched in the device name)."""
    return suite["device"]["type"] == "cuda" and gpu.upper() in suite["device"]["name"].upper()


def is_a100(suite: dict) -> bool:
    return measured_on(suite, A100)


# --- the jobs, as the walltimes plan them -------------------------------------------------------


@dataclass(frozen=True)
class PlannedRow:
    """A row of the table: a rule's jobs (each as resources.job_work takes it: a behaviour, a
    group's key, or None), the work they do in words, and their counted work."""

    stage: str
    rule: str
    jobs: tuple[str | None, ...]
    work: int
    unit: str
    note: str = ""

    def planned(self, config: dict) -> list[perf.Work]:
        """Each job's counted work, as its walltime reads it."""
        return [resources.job_work(config, self.rule, job) for job in self.jobs]

    def flops(self, config: dict) -> dict[str, float]:
        """The jobs' FLOPs by dtype, summed."""
        out: dict[str, float] = {}
        for work in self.planned(config):
            for dtype, flops in work.flops.items():
                out[dtype] = out.get(dtype, 0.0) + flops
        return out


def _source_rows(config: dict, cluster: Cluster) -> list[PlannedRow]:
    """The dictionary sources' rows: those of the rule each record names (dictionary_sources;
    an unknown `sae.source` is refused there in one line), each for its part of the run."""
    rows = {"train_sae": _capture_rows, "train_sae_stream": _stream_rows,
            "pretrained_sae": _pretrained_rows}  # fmt: skip
    return [
        row
        for source in dictionary_sources.used(config)  # SAEs and transcoders may differ
        for row in rows[source.rule](dictionary_sources.part(config, source), cluster)
    ]


def _capture_rows(config: dict, cluster: Cluster) -> list[PlannedRow]:
    """The capture (or its shards) and one train_sae job per dictionary."""
    from circuitflow.capture import plan as capture_plan

    run = description.describe(config)
    t, _, contexts = capture_plan.contexts(config, run.model.cfg)
    shards = config["capture"]["shards"]
    rule, jobs = ("capture", (None,)) if shards == 1 else ("capture_shard", (None,) * shards)
    n = len(run.dictionaries)
    return [
        PlannedRow("capture", rule, jobs, contexts * t, "tokens",
                   f"forward passes through {max(run.layers) + 1} layers, every hook's rows "
                   "written"),
        PlannedRow("train_sae", "train_sae", (None,) * n, n * config["sae"]["total_tokens"],
                   "tokens", "one job a dictionary: its training rows and its evaluation"),
        *_transcoder_rows(config),
    ]  # fmt: skip


def _stream_rows(config: dict, cluster: Cluster) -> list[PlannedRow]:
    """The streaming jobs (stream_groups.stream_groups on the `cluster`'s GPU)."""
    from circuitflow import stream_groups

    run = description.describe(config)
    groups = stream_groups.stream_groups(config, cluster, on_gpu=True)
    passes = sum(g.depth for g in groups) / run.model.n_layers
    note = (
        f"{_jobs_of(groups, 'SAEs')}, {passes:.2f} forward passes a token and each SAE's "
        "evaluation, no activation files"
    )
    tokens = len(run.dictionaries) * config["sae"]["total_tokens"]
    keys = tuple(g.key for g in groups)
    return [
        PlannedRow("train_sae_stream", "train_sae_stream", keys, tokens, "tokens", note),
        *_transcoder_rows(config),
    ]


def _pretrained_rows(config: dict, cluster: Cluster) -> list[PlannedRow]:
    """The published dictionaries' jobs, grouped as the streaming jobs are."""
    from circuitflow import stream_groups

    run = description.describe(config)
    groups = stream_groups.stream_groups(config, cluster, on_gpu=True)
    contexts = config["sae"]["eval_contexts"]
    note = (
        f"{_jobs_of(groups, 'dictionaries')}, each evaluated on {contexts} contexts (clean, "
        "spliced, ablated and firing passes), nothing trained"
    )
    tokens = len(run.dictionaries) * contexts * run.context_length
    keys = tuple(g.key for g in groups)
    return [
        PlannedRow("pretrained_sae", "pretrained_sae", keys, tokens, "tokens", note),
        *_transcoder_rows(config),
    ]


def _transcoder_rows(config: dict) -> list[PlannedRow]:
    """The transcoders' replacement job (sae.kind transcoder or both, trained or published)."""
    run = description.describe(config)
    if not run.transcoders:
        return []
    tokens = config["sae"]["eval_contexts"] * run.context_length
    note = "every MLP replaced by its transcoder at once"
    return [PlannedRow("transcoder_replacement", "transcoder_replacement", (None,), tokens,
                       "tokens", note)]  # fmt: skip


def _jobs_of(groups, what: str) -> str:
    """`3 jobs of 8 SAEs` (`4 jobs of 6-7 SAEs`)."""
    sizes = sorted({len(g.members) for g in groups})
    each = "-".join(str(n) for n in sizes[:: max(1, len(sizes) - 1)])
    return f"{len(groups)} job{'s' * (len(groups) > 1)} of {each} {what}"


def planned_rows(config: dict, cluster: Cluster | None = None) -> list[PlannedRow]:
    """The GPU jobs of a run, by stage, as the workflow schedules them and their walltimes count
    them: the baseline, the dictionary source's jobs, then per behaviour attribution, the
    per-prompt graphs and the interventions where the run has them. `cluster`: the one whose GPU
    and walltime cap group the SAE jobs (default: an A100 without a cap)."""
    run = description.describe(config)
    cluster = cluster or Cluster()
    behaviours = tuple(b for b, _ in run.prompts)

    def prompts(cap: int | None) -> int:
        return sum(run.n_prompts(b, cap) for b in behaviours)

    attr = config["attribution"]
    rows = [PlannedRow("baseline", "baseline", behaviours, prompts(None), "prompts")]
    rows += _source_rows(config, cluster)
    if run.spliced:
        rows.append(PlannedRow("attribution", "attribution", behaviours,
                               prompts(attr.get("max_prompts")), "prompts"))  # fmt: skip
    if sites.trains_transcoders(config) and attr["prompt_graphs"]:
        rows.append(PlannedRow("prompt_graphs", "prompt_graphs", behaviours,
                               prompts(attr["prompt_graphs"]), "prompts"))  # fmt: skip
    if run.spliced:
        cap = config["interventions"].get("max_prompts")
        rows.append(PlannedRow("interventions", "interventions", behaviours, prompts(cap),
                               "prompts"))  # fmt: skip
    rows.append(_features_row(config))
    return rows


def _features_row(config: dict) -> PlannedRow:
    """The features jobs: one streamed pass a group of layers over features.n_tokens tokens,
    every member dictionary encoded, then one sweep over the contexts kept."""
    from circuitflow.features import plan as features_plan

    groups = features_plan.groups(config)
    n = len(features_plan.members(config))
    note = f"{len(groups)} job{'s' * (len(groups) > 1)} of {n} dictionaries' statistics"
    tokens = n * config["features"]["n_tokens"]
    return PlannedRow("features", "features", tuple(g.key for g in groups), tokens, "tokens",
                      note)  # fmt: skip


def passes_a_prompt(config: dict, stage: str) -> dict[str, float]:
    """Forward-pass equivalents a prompt by part, averaged over every behaviour's prompts, of
    attribution or the interventions: the counts their plans (`prompt_work`) charge."""
    from circuitflow.attribution import plan as attribution_plan
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.interventions import plan as interventions_plan
    from circuitflow.interventions.config import InterventionsConfig

    run = description.describe(config)
    if stage == "attribution":
        acfg = AttributionConfig.from_dict(config["attribution"])
        cap = acfg.max_prompts

        def work(n: int) -> dict[str, float]:
            return attribution_plan.prompt_work(run, acfg, n)[0]
    else:
        icfg = InterventionsConfig.from_dict(config["interventions"])
        cap = icfg.max_prompts

        def work(n: int) -> dict[str, float]:
            return interventions_plan.prompt_work(run, icfg)[0]

    counts = [run.n_prompts(b, cap) for b, _ in run.prompts]
    parts = [work(n) for n in counts]
    total = sum(counts)
    return {k: sum(p[k] * n for p, n in zip(parts, counts, strict=True)) / total for k in parts[0]}


# --- the rates the suite measured ---------------------------------------------------------------


def _records(suite: dict, model: str, stage: str) -> list[dict]:
    return [r for r in suite["results"] if r["model"] == model and r["stage"] == stage]


def _record(suite: dict, model: str, stage: str, config: dict) -> tuple[dict, bool]:
    """The suite's record for `stage` on `model`, and whether it is this run's exact work: for
    SAE training the variant of the config's architecture, width and k, else the widest."""
    records = _records(suite, model, stage)
    if not records:
        raise ValueError(f"the suite result has no {stage} figures for {model}")
    if stage != "sae_train":
        return records[0], True
    sae, width = config["sae"], description.describe(config).widest()
    for rec in records:
        if (rec["architecture"], rec["d_sae"], rec["k"]) == (sae["architecture"], width, sae["k"]):
            return rec, True
    return max(records, key=lambda r: r["d_sae"]), False


def _peak(gpu: str, dtype: str) -> float:
    peaks = perf.NOMINAL_PEAK_FLOPS[gpu]
    return peaks.get(dtype) or peaks.get("bfloat16") or peaks["float16"]


def _device_peak(suite: dict, rec: dict, dtype: str) -> float:
    """The measured device's peak for `dtype`: its datasheet's, else the suite's measured one,
    else the peak the record's share is of."""
    nominal = perf.nominal_peak_flops(suite["device"]["name"], dtype)
    if suite["device"]["type"] == "cuda" and nominal:
        return nominal
    return suite.get("peak_flops", {}).get("measured", {}).get(dtype) or rec["device_peak_flops"]


def _rate(suite: dict, rec: dict, dtype: str, gpu: str) -> float:
    """FLOP/s of `dtype` work of the record's kind on a `gpu`: measured there, or the record's
    achieved rate scaled by the two devices' peaks for the dtype (the same roofline share).
    Work the suite measured in float32 without TF32 (attribution, as its stage runs on every
    device) scales by that dtype's peaks, whatever dtype its plan counts it in."""
    if measured_on(suite, gpu):
        return rec["achieved_flops"]
    if set(rec.get("flops_by_dtype", ())) == {perf.FLOAT32_NO_TF32}:
        dtype = perf.FLOAT32_NO_TF32
    return rec["achieved_flops"] * _peak(gpu, dtype) / _device_peak(suite, rec, dtype)


def _how(suite: dict, rec: dict, gpu: str) -> str:
    if measured_on(suite, gpu):
        return f"measured ({gpu})"
    device = "CPU" if suite["device"]["type"] == "cpu" else suite["device"]["name"]
    return f"projected: {device} roofline share {rec['roofline_share']:.0%} x {gpu} peak"


# --- the table ----------------------------------------------------------------------------------


def estimate(
    suite: dict, config: dict, allow_small: bool = False, gpu: str = A100, cluster=None
) -> pd.DataFrame:
    """One row per stage (and a total): jobs, work, FLOPs, hours on a `gpu` (`gpu_hours`, a key
    of perf.NOMINAL_PEAK_FLOPS: the cluster's `gpu_type`) and their source.

    `--small` suite results describe 2-layer models; they are refused unless `allow_small`.
    `cluster`: the profile's circuitflow.cluster.Cluster, whose walltime cap splits the
    grouped SAE jobs as its dry run does (default: none, every job on a `gpu`).
    """
    if suite["mode"] == "small" and not allow_small:
        raise ValueError(
            "a --small suite result measures 2-layer stand-ins, not the real architectures; "
            "run benchmarks/gpu_suite.py without --small"
        )
    key = architectures.architecture_key(config["model"]["name"])
    if key is None:
        raise ValueError(
            f"model.name {config['model']['name']!r}: the GPU suite covers only "
            f"{', '.join(architectures.ARCHITECTURES)}"
        )
    import pandas as pd

    cluster = Cluster(gpu_type=gpu) if cluster is None else replace(cluster, gpu_type=gpu)
    rows = [_row(suite, config, key, planned, gpu) for planned in planned_rows(config, cluster)]
    frame = pd.DataFrame(rows).assign(gpu=gpu)
    total = {
        "gpu": gpu,
        "stage": "total",
        "jobs": int(frame["jobs"].sum()),
        "work": None,
        "unit": "",
        "pflop": frame["pflop"].sum(),
        "gpu_hours": frame["gpu_hours"].sum(),
        "source": "job start-up (imports, loading the model) not included",
    }
    return pd.concat([frame, pd.DataFrame([total])], ignore_index=True)


def _row(suite: dict, config: dict, key: str, planned: PlannedRow, gpu: str) -> dict[str, Any]:
    """A row's hours: each dtype's FLOPs at the rate of the suite's stage that stands for it
    (measured.RULE_STAGES), plus the work that is neither; projected, at least the disk's."""
    works = planned.planned(config)
    stages = measured.RULE_STAGES[planned.rule]
    by_stage: dict[str, float] = {}  # seconds, by the suite's stage
    records = {}
    for dtype, flops in planned.flops(config).items():
        stage = stages.get(dtype, stages["*"])
        rec, exact = _record(suite, key, stage, config)
        records[stage] = rec, exact
        by_stage[stage] = by_stage.get(stage, 0.0) + flops / _rate(suite, rec, dtype, gpu)
    seconds = sum(by_stage.values()) + sum(w.other_seconds for w in works)
    # The row's rate is named by the stage most of its hours run at.
    main = max(by_stage, key=by_stage.get) if by_stage else stages["*"]
    rec, exact = records.get(main) or _record(suite, key, main, config)
    how = _how(suite, rec, gpu)
    disk = sum(w.disk_bytes for w in works) if planned.rule in WRITES else 0.0
    if not measured_on(suite, gpu) and disk / suite["disk_write_bytes_per_s"] > seconds:
        # Writing the activations cannot go faster than the disk the suite measured.
        seconds = disk / suite["disk_write_bytes_per_s"]
        how = f"disk bound: {disk / 1e9:,.0f} GB at the suite's disk speed"
    notes = [how, *_notes(config, planned, by_stage, exact, rec)]
    flops = sum(sum(w.flops.values()) for w in works)
    return {
        "stage": planned.stage,
        "jobs": len(planned.jobs),
        "work": int(planned.work),
        "unit": planned.unit,
        "pflop": flops / 1e15,
        "gpu_hours": seconds / 3600,
        "source": "; ".join(n for n in notes if n),
    }


def _notes(config, planned, by_stage, exact, rec) -> list[str]:
    """What a row charges, in words."""
    plen = description.describe(config).prompt_length
    notes = [planned.note]
    if len(by_stage) > 1:
        notes.append(", ".join(f"{s / 3600:.2f} h at the {stage} rate"
                               for stage, s in by_stage.items()))  # fmt: skip
    if not exact:
        notes.append(f"rate of the {rec['variant']} SAE scaled by FLOPs")
    if planned.stage == "baseline":
        notes.append(f"2 forward passes a prompt (clean, corrupted) of {plen} tokens at the "
                     "measured forward rate")  # fmt: skip
    elif planned.stage == "attribution":
        passes = passes_a_prompt(config, "attribution")
        detail = ", ".join(f"{k} {v:.1f}" for k, v in passes.items())
        notes.append(
            f"{config['attribution']['method']}: {sum(passes.values()):.1f} forward-pass "
            f"equivalents a prompt ({detail}) of {plen} tokens, at the measured atp rate"
        )
    elif planned.stage == "prompt_graphs":
        notes.append(f"a replacement graph a prompt of {plen} tokens at the measured atp rate")
    elif planned.stage == "interventions":
        passes = passes_a_prompt(config, "interventions")
        detail = ", ".join(f"{k} {v:.0f}" for k, v in passes.items())
        notes.append(f"at most {sum(passes.values()):.0f} forward passes a prompt ({detail}) of "
                     f"{plen} tokens, every SAE spliced, at the measured forward rate")  # fmt: skip
    return notes


def markdown(frame: pd.DataFrame) -> str:
    """The estimate as the Markdown table docs/csd3.md shows."""
    gpu = frame["gpu"].iloc[0]
    lines = [f"| stage | jobs | work | {gpu}-hours | how |", "| --- | ---: | ---: | ---: | --- |"]
    for r in frame.itertuples():
        work = f"{int(r.work):,} {r.unit}" if r.work is not None and r.work == r.work else ""
        lines.append(f"| {r.stage} | {r.jobs} | {work} | {r.gpu_hours:.2f} | {r.source} |")
    return "\n".join(lines)


def describe(suite: dict, gpu: str = A100) -> str:
    d = suite["device"]
    kind = (
        f"measured on an {gpu}"
        if measured_on(suite, gpu)
        else f"projected to an {gpu} (not measured)"
    )
    return (
        f"from the GPU suite run on {d['name']} ({d['type']}, {suite['mode']}, "
        f"{suite['created']}): {kind}"
    )


def load_config(path: Path | str) -> dict:
    from circuitflow import config as cf_config

    return cf_config.load(path)
