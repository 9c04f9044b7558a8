"""GPU-hours of a full run, from the rates the GPU suite measured (benchmarks/gpu_suite.py).

For a resolved config whose model the suite covers (GPT-2 small, Qwen2.5-0.5B):

- capture: one forward pass over every context (`capture.n_tokens` stored rows, BOS left out,
  so n_tokens / (context_length - 1) contexts of context_length tokens) at the suite's capture
  rate, every site and layer hooked at once;
- train_sae: `sae.total_tokens` per site and layer at the suite's rate for that SAE (its
  variant when one matches the config's architecture, width and k; otherwise the FLOP rate the
  nearest variant reached, applied to this SAE's FLOPs per token);
- attribution: per behaviour, `n_prompts` (or `max_prompts`) prompts; the suite times the fast
  pass (atp: 4 forward-pass equivalents); the configured method, exact patching, edges and
  their validation (on `validation_prompts` prompts) are counted in forward-pass equivalents
  by the stage's plan (attribution/plan.py, `prompt_work`: the count its walltime charges,
  checked against the stage's own count by tests/attribution) and charged at the same rate;
- baseline (two forward passes a prompt) and interventions (interventions/plan.py,
  `prompt_work`: an upper bound checked against the stage's own count on the default run by
  tests/workflow/test_default_model.py, every SAE spliced) at the rate the suite measured for a
  bare forward pass.

Every dictionary is counted at its own width (circuitflow.description: a published one's
cfg.json, else the config's).

When the suite ran on an A100 the hours are measured A100-hours. Otherwise they are projected to
an A100: the stage is assumed to reach the same share of the A100's datasheet peak (bf16 312
TFLOP/s for the model, TF32 156 for the fp32 SAE) as it reached of the measured device's peak
(its roofline share). From a CPU result that is a projection, not a measurement: GPU kernels,
memory bandwidth and launch overheads behave differently, so the figures are labelled as such.
Per-job start-up (imports, loading the model) is left out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from circuitflow import description, perf
from circuitflow.cluster import Cluster
from circuitflow.errors import InputError
from circuitflow.memory import capture_hooks
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token

if TYPE_CHECKING:
    from circuitflow.sae.config import SAETrainConfig

A100 = "A100"  # CSD3's GPU, the default target (a profile's `gpu_type` names another)
TARGET_A100_HOURS = 10.0  # the project's aim for a full Qwen2.5-0.5B run


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


def _records(suite: dict, model: str, stage: str) -> list[dict]:
    return [r for r in suite["results"] if r["model"] == model and r["stage"] == stage]


def _one(suite: dict, model: str, stage: str) -> dict:
    found = _records(suite, model, stage)
    if not found:
        raise ValueError(f"the suite result has no {stage} figures for {model}")
    return found[0]


def measured_on(suite: dict, gpu: str = A100) -> bool:
    """The suite ran on a `gpu` (a key of perf.NOMINAL_PEAK_FLOPS, matched in the device name)."""
    return suite["device"]["type"] == "cuda" and gpu.upper() in suite["device"]["name"].upper()


def is_a100(suite: dict) -> bool:
    return measured_on(suite, A100)


def _peak(gpu: str, dtype: str) -> float:
    peaks = perf.NOMINAL_PEAK_FLOPS[gpu]
    return peaks.get(dtype) or peaks.get("bfloat16") or peaks["float16"]


def _seconds(rec: dict, work_flops: float, peak: float, suite: dict, gpu: str) -> tuple[float, str]:
    """Seconds for `work_flops` of this record's kind of work on a `gpu`, and how we know."""
    if measured_on(suite, gpu):
        return work_flops / rec["achieved_flops"], f"measured ({gpu})"
    device = "CPU" if suite["device"]["type"] == "cpu" else suite["device"]["name"]
    share = rec["roofline_share"]
    return (
        work_flops / (share * peak),
        f"projected: {device} roofline share {share:.0%} x {gpu} peak",
    )


def _sae_record(suite: dict, model: str, sae: SAETrainConfig, d_sae: int) -> tuple[dict, bool]:
    records = _records(suite, model, "sae_train")
    if not records:
        raise ValueError(f"the suite result has no sae_train figures for {model}")
    for rec in records:
        if (rec["architecture"], rec["d_sae"], rec["k"]) == (sae.architecture, d_sae, sae.k):
            return rec, True
    return max(records, key=lambda r: r["d_sae"]), False


@dataclass(frozen=True)
class PromptStage:
    """A prompt stage's count over every behaviour: its prompts, forward-pass equivalents a
    prompt by part (averaged over the prompts), the FLOPs of one such pass and in all."""

    prompts: int
    passes: dict[str, float]
    per_pass: float
    flops: float


def prompt_flops(config: dict, prompt_length: int) -> dict[str, PromptStage]:
    """Attribution's and the interventions' counts over every behaviour at `prompt_length`
    tokens a prompt, by the stages' own plans (attribution/plan.py and interventions/plan.py,
    `prompt_work`) over the run's description: the count their walltimes charge, at the length
    the suite measured its rates at. Attribution's feature contexts are not charged here."""
    from circuitflow.attribution import plan as attribution_plan
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.interventions import plan as interventions_plan
    from circuitflow.interventions.config import InterventionsConfig

    run = description.describe(config)
    acfg = AttributionConfig.from_dict(config["attribution"])
    icfg = InterventionsConfig.from_dict(config["interventions"])
    stages = (
        ("attribution", acfg.max_prompts,
         lambda n: attribution_plan.prompt_work(run, acfg, n, prompt_length)),
        ("interventions", icfg.max_prompts,
         lambda n: interventions_plan.prompt_work(run, icfg, prompt_length)),
    )  # fmt: skip
    out = {}
    for stage, cap, work in stages:
        counts = [run.n_prompts(b, cap) for b, _ in run.prompts]
        per_behaviour = [work(n) for n in counts]
        per_pass = per_behaviour[0][1]  # the same pass for every behaviour
        weighted = [(p, n) for (p, _), n in zip(per_behaviour, counts, strict=True)]
        prompts = sum(counts)
        passes = {k: sum(p[k] * n for p, n in weighted) / prompts for k in weighted[0][0]}
        flops = sum(n * sum(p.values()) * per_pass for p, n in weighted)
        out[stage] = PromptStage(prompts, passes, per_pass, flops)
    return out


def estimate(
    suite: dict, config: dict, allow_small: bool = False, gpu: str = A100, cluster=None
) -> pd.DataFrame:
    """One row per stage (and a total): jobs, work, FLOPs, hours on a `gpu` (`gpu_hours`, a key
    of perf.NOMINAL_PEAK_FLOPS: the cluster's `gpu_type`) and their source.

    `--small` suite results describe 2-layer models; they are refused unless `allow_small`.
    `cluster`: the profile's circuitflow.cluster.Cluster, whose walltime cap splits the
    streaming jobs as its dry run does (default: none, every job on a `gpu`).
    """
    from circuitflow.capture.config import CaptureConfig

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
    arch = architectures.config(key)
    n_hooks = len(description.describe(config).dictionaries)
    rows = []

    cap = CaptureConfig.from_dict(config["capture"])
    ctx = int(cap.context_length or min(arch.n_ctx, 128))
    per_ctx = ctx - 1 if cap.exclude_bos else ctx
    # The grouped SAE jobs on a `gpu`, split by the profile's walltime cap where given.
    cluster = Cluster(gpu_type=gpu) if cluster is None else replace(cluster, gpu_type=gpu)
    if config["sae"]["source"] == "stream":
        rows.append(_stream_row(suite, config, key, arch, ctx, per_ctx, gpu, cluster))
    elif config["sae"]["source"] == "pretrained":
        rows.append(_pretrained_row(suite, config, key, arch, ctx, n_hooks, gpu, cluster))
    else:
        rows.extend(_capture_rows(suite, config, key, arch, cap, ctx, per_ctx, n_hooks, gpu))
    rec = _one(suite, key, "attribution")
    plen = rec["prompt_length"]
    counted = prompt_flops(config, plen)
    attr = counted["attribution"]
    prompts, passes, work_flops = attr.prompts, attr.passes, attr.flops
    share_model = forward_flops_per_token(arch, plen) * plen
    model_part = share_model / attr.per_pass
    peak = 1 / (model_part / _peak(gpu, "bfloat16") + (1 - model_part) / _peak(gpu, "float32"))
    s, source = _seconds(rec, work_flops, peak, suite, gpu)
    detail = ", ".join(f"{k} {v:.1f}" for k, v in passes.items())
    source += (
        f"; {config['attribution']['method']}: {sum(passes.values()):.1f} forward-pass "
        f"equivalents a prompt ({detail}) at the measured atp rate, prompts of {plen} tokens"
    )
    n_beh = len(config["behaviours"])
    rows.append(_row("attribution", n_beh, prompts, "prompts", work_flops, s, source))

    # Baseline and interventions: forward passes of the plain model (interventions: with every
    # SAE spliced), at the rate the suite measured for a bare forward pass.
    rec = _one(suite, key, "forward")
    n_all = sum(b["n_prompts"] for b in config["behaviours"].values())
    work_flops = 2 * n_all * plen * forward_flops_per_token(arch, plen)
    s, source = _seconds(rec, work_flops, _peak(gpu, "bfloat16"), suite, gpu)
    source += "; 2 forward passes a prompt (clean, corrupted) at the measured forward rate"
    rows.insert(0, _row("baseline", n_beh, n_all, "prompts", work_flops, s, source))
    iv = counted["interventions"]
    n_iv, passes, work_flops = iv.prompts, iv.passes, iv.flops
    s, source = _seconds(rec, work_flops, _peak(gpu, "bfloat16"), suite, gpu)
    detail = ", ".join(f"{k} {v:.0f}" for k, v in passes.items())
    source += (
        f"; at most {sum(passes.values()):.0f} forward passes a prompt ({detail}), every SAE "
        "spliced, at the measured forward rate"
    )
    rows.append(_row("interventions", n_beh, n_iv, "prompts", work_flops, s, source))

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


def _capture_rows(suite, config, key, arch, cap, ctx, per_ctx, n_hooks, gpu) -> list[dict]:
    """`sae.source: capture`: the capture (one forward pass of every context, the files
    written) and one train_sae job per site and layer."""
    from circuitflow.sae.config import SAETrainConfig

    rows = []
    tokens = math.ceil(cap.n_tokens / per_ctx) * ctx
    rec = _one(suite, key, "capture")
    flops = forward_flops_per_token(arch, ctx, max(config["layers"]) + 1, unembed=False)
    s, source = _seconds(rec, tokens * flops, _peak(gpu, "bfloat16"), suite, gpu)
    if not measured_on(suite, gpu):
        # Writing the activations cannot go faster than the disk the suite measured.
        itemsize = 2 if cap.dtype == "float16" else 4
        stored = math.ceil(cap.n_tokens / per_ctx) * per_ctx * capture_hooks(config) * arch.d_model
        write_s = stored * itemsize / suite["disk_write_bytes_per_s"]
        if write_s > s:
            s = write_s
            source = f"disk bound: {stored * itemsize / 1e9:,.0f} GB at the suite's disk speed"
    rows.append(_row("capture", 1, tokens, "tokens", tokens * flops, s, source))

    sae = SAETrainConfig.from_dict(config["sae"])
    d_sae = description.describe(config).widest()
    rec, exact = _sae_record(suite, key, sae, d_sae)
    flops = perf.sae_training_flops_per_token(arch.d_model, d_sae)
    work = n_hooks * sae.total_tokens
    s, source = _seconds(rec, work * flops, _peak(gpu, "float32"), suite, gpu)
    if not exact:
        source += f"; rate of the {rec['variant']} SAE scaled by FLOPs"
    rows.append(_row("train_sae", n_hooks, work, "tokens", work * flops, s, source))
    return rows


def _stream_row(suite, config, key, arch, ctx, per_ctx, gpu, cluster) -> dict[str, Any]:
    """`sae.source: stream`: the streaming jobs (stream_groups.stream_groups for a `gpu`), each
    SAE's `sae.total_tokens` at the suite's SAE rate, and each job's forward passes
    (every training context through its deepest layer) at the suite's capture rate, no disk."""
    from circuitflow import stream_groups
    from circuitflow.sae.config import SAETrainConfig

    sae = SAETrainConfig.from_dict(config["sae"])
    d_sae = description.describe(config).widest()
    groups = stream_groups.stream_groups(config, cluster, on_gpu=True)
    n_saes = sum(len(g.members) for g in groups)
    rec, exact = _sae_record(suite, key, sae, d_sae)
    work = n_saes * sae.total_tokens
    sae_flops = work * perf.sae_training_flops_per_token(arch.d_model, d_sae)
    s_sae, source = _seconds(rec, sae_flops, _peak(gpu, "float32"), suite, gpu)
    if not exact:
        source += f"; rate of the {rec['variant']} SAE scaled by FLOPs"
    tokens = math.ceil(sae.total_tokens / per_ctx) * ctx
    fwd = sum(tokens * forward_flops_per_token(arch, ctx, g.depth, unembed=False)
              for g in groups)  # fmt: skip
    s_fwd, how = _seconds(_one(suite, key, "capture"), fwd, _peak(gpu, "bfloat16"), suite, gpu)
    passes = sum(g.depth for g in groups) / arch.n_layers
    sizes = sorted({len(g.members) for g in groups})
    each = "-".join(str(n) for n in sizes[:: max(1, len(sizes) - 1)])
    jobs = f"{len(groups)} job{'s' * (len(groups) > 1)} of {each} SAEs"
    source += (
        f"; {jobs}, {passes:.2f} forward passes a token ({s_fwd / 3600:.2f} h at the "
        f"capture rate, {how.split(':')[0]}), no activation files"
    )
    return _row("train_sae_stream", len(groups), work, "tokens", sae_flops + fwd, s_sae + s_fwd,
                source)  # fmt: skip


def _pretrained_row(suite, config, key, arch, ctx, n_hooks, gpu, cluster) -> dict[str, Any]:
    """`sae.source: pretrained`: nothing captured or trained; the pretrained_sae jobs (grouped
    as streaming groups them: stream_groups.stream_groups for a `gpu`) measure each dictionary
    on `sae.eval_contexts` contexts (clean, spliced and zero-ablated passes, as deep as its
    layer; counted here as whole passes) at the suite's forward rate."""
    from circuitflow import stream_groups

    jobs = len(stream_groups.stream_groups(config, cluster, on_gpu=True))
    contexts = config["sae"]["eval_contexts"]
    flops = n_hooks * 3 * contexts * ctx * forward_flops_per_token(arch, ctx)
    s, source = _seconds(_one(suite, key, "forward"), flops, _peak(gpu, "bfloat16"), suite, gpu)
    source += (
        f"; 3 forward passes of {contexts} contexts a dictionary, {n_hooks} dictionaries in "
        f"{jobs} job{'s' * (jobs > 1)}, nothing trained"
    )
    return _row("pretrained_sae", jobs, n_hooks * contexts * ctx, "tokens", flops, s, source)


def _row(stage, jobs, work, unit, flops, seconds, source) -> dict[str, Any]:
    return {
        "stage": stage,
        "jobs": int(jobs),
        "work": int(work),
        "unit": unit,
        "pflop": flops / 1e15,
        "gpu_hours": seconds / 3600,
        "source": source,
    }


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
    measured = measured_on(suite, gpu)
    kind = f"measured on an {gpu}" if measured else f"projected to an {gpu} (not measured)"
    return (
        f"from the GPU suite run on {d['name']} ({d['type']}, {suite['mode']}, "
        f"{suite['created']}): {kind}"
    )


def load_config(path: Path | str) -> dict:
    from circuitflow import config as cf_config

    return cf_config.load(path)
