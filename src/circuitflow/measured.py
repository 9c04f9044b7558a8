"""GPU rates measured by the GPU suite, as the walltime plans read them.

`benchmarks/measure.py` (make bench-gpu) writes `benchmarks/results/gpu_suite-<gpu>-cuda.json`:
each stage's achieved FLOP/s (matrix FLOPs a token, as the plans count them, over the measured
wall time) on GPT-2 small's and Qwen2.5-0.5B's architectures. Where such a file exists for a
profile's `gpu_type`, circuitflow.resources plans a job's walltime at a share of the rate its
stage reached (`Cluster.measured_rate_percent`) instead of a share of the datasheet peak
(`gpu_peak_percent`); elsewhere the plans stay projections.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

# The suite's stage whose measured rate stands for a rule's work, by the dtype of the work
# (its perf.Work's keys; "*": any other): float32 work of the training rules is SAE training,
# the rest model passes. Rules not named here plan at the datasheet share.
RULE_STAGES: dict[str, dict[str, str]] = {
    "baseline": {"*": "forward"},
    "capture": {"*": "capture"},
    "capture_shard": {"*": "capture"},
    "train_sae": {"float32": "sae_train", "*": "forward"},
    "train_sae_stream": {"float32": "sae_train", "*": "capture"},
    "transcoder_replacement": {"*": "forward"},
    "pretrained_sae": {"*": "forward"},
    "attribution": {"*": "attribution"},
    "prompt_graphs": {"*": "attribution"},
    "interventions": {"*": "forward"},
    # A forward pass with hooks read, each dictionary encoded in float32 (as SAE training does).
    "features": {"float32": "sae_train", "*": "capture"},
}


@cache
def suite_for(gpu_type: str, folder: str = str(RESULTS)) -> dict | None:
    """The newest full GPU-suite result measured on a `gpu_type` GPU (matched in the device's
    name, as perf.nominal_peak_flops matches it), or None."""
    found = []
    for path in sorted(Path(folder).glob("gpu_suite-*-cuda.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        device = data.get("device", {})
        if (
            device.get("type") == "cuda"
            and gpu_type.upper() in str(device.get("name", "")).upper()
            and data.get("mode") == "full"
        ):
            found.append(data)
    return max(found, key=lambda d: d.get("created", "")) if found else None


def stage_rate(suite: dict, stage: str, model: str | None) -> float | None:
    """FLOP/s the suite measured for `stage`: `model`'s record (an architectures key) where the
    suite ran it, else the slowest model's, the conservative choice for a model it did not run;
    for SAE training the slowest variant."""
    records = [r for r in suite["results"] if r["stage"] == stage and r.get("achieved_flops")]
    mine = [r for r in records if r["model"] == model]
    chosen = mine or records
    return min(r["achieved_flops"] for r in chosen) if chosen else None


def rule_rates(
    gpu_type: str, rule: str, model: str | None, folder: Path | str = RESULTS
) -> dict[str, float] | None:
    """Measured FLOP/s for each dtype of `rule`'s work ("*": the rest) on a `gpu_type`, or None
    where nothing was measured there for it."""
    suite = suite_for(gpu_type, str(folder))
    stages = RULE_STAGES.get(rule)
    if suite is None or stages is None:
        return None
    rates = {dtype: stage_rate(suite, stage, model) for dtype, stage in stages.items()}
    return None if None in rates.values() else rates
