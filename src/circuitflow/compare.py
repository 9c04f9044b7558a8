"""Compare the metrics of two results directories (e.g. a CSD3 run against a workstation run).

`collect(results)` flattens what a run concluded into `{key: value}`: baseline metrics per
behaviour, SAE metrics per site and layer, the top attribution nodes (heads and SAE features, as
a set, and their scores) and the interventions' faithfulness and completeness. `compare(a, b)`
lists the keys whose values differ beyond `atol + rtol * |b|` (numbers), differ at all (lists
of top nodes, compared as sets so that ties swapping places do not count), or exist on one
side only. Timings and memory are not compared: they differ between machines by design.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASELINE_KEYS = (
    "logit_diff_mean",
    "logit_diff_std",
    "accuracy",
    "top1_accuracy",
    "corrupted_logit_diff_mean",
    "expected_calibration_error",
    "brier_score",
    "n_prompts",
    "prompts_sha256",
    "model_weights_sha256",
)
SAE_KEYS = ("l0", "explained_variance", "dead_fraction", "ce_loss_recovered", "tokens_trained")
INTERVENTION_KEYS = (
    "faithfulness",
    "completeness",
    "faithfulness_heldout",
    "completeness_heldout",
    "faithfulness_auc",
    "random_faithfulness",
    "random_completeness",
    "smallest_faithful_size",
    "circuit_size",
    "circuit",
    "logit_diff_clean",
    "logit_diff_empty",
    "accuracy_clean",
    "seeds",
)
TOP_N = 10


@dataclass
class Difference:
    key: str
    a: Any
    b: Any
    kind: str  # changed | only_a | only_b

    def __str__(self) -> str:
        if self.kind == "only_a":
            return f"only in A: {self.key} = {_fmt(self.a)}"
        if self.kind == "only_b":
            return f"only in B: {self.key} = {_fmt(self.b)}"
        delta = ""
        if _is_number(self.a) and _is_number(self.b):
            delta = f"  (diff {self.b - self.a:+.6g})"
        return f"changed: {self.key}: {_fmt(self.a)} -> {_fmt(self.b)}{delta}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def _pick(prefix: str, data: dict, keys) -> dict:
    return {f"{prefix}/{k}": data[k] for k in keys if k in data and not isinstance(data[k], dict)}


def _top_nodes(prefix: str, frame, label, n: int = TOP_N) -> dict:
    if frame.empty or "score" not in frame:
        return {}
    top = frame.reindex(frame["score"].abs().sort_values(ascending=False).index).head(n)
    names = [label(row) for row in top.itertuples()]
    out: dict[str, Any] = {f"{prefix}/top{n}": sorted(names)}
    for name, score in zip(names, top["score"], strict=True):
        out[f"{prefix}/score/{name}"] = float(score)
    return out


def collect(results: Path | str) -> dict[str, Any]:
    """The comparable metrics of one results directory, keyed `stage/item/metric`."""
    import pandas as pd

    root = Path(results)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {root} does not exist")
    metrics: dict[str, Any] = {}
    for path in sorted(root.glob("baseline/*.json")):
        metrics |= _pick(f"baseline/{path.stem}", _read_json(path), BASELINE_KEYS)
    for path in sorted(root.glob("saes/*/layer_*/metrics.json")):
        site, layer = path.parent.parent.name, path.parent.name
        metrics |= _pick(f"sae/{site}/{layer}", _read_json(path), SAE_KEYS)
    for beh in sorted(p for p in root.glob("attribution/*") if p.is_dir()):
        heads = beh / "heads.parquet"
        if heads.is_file():
            metrics |= _top_nodes(
                f"attribution/{beh.name}/heads",
                pd.read_parquet(heads),
                lambda r: f"L{r.layer}H{r.head}",
            )
        features = beh / "features.parquet"
        if features.is_file():
            metrics |= _top_nodes(
                f"attribution/{beh.name}/features",
                pd.read_parquet(features),
                lambda r: f"{r.site}.L{r.layer}.{'err' if r.feature < 0 else r.feature}",
            )
    for path in sorted(root.glob("interventions/*/summary.json")):
        metrics |= _pick(f"interventions/{path.parent.name}", _read_json(path), INTERVENTION_KEYS)
    if not metrics:
        raise ValueError(f"no metrics found under {root} (is it a circuitflow results directory?)")
    return metrics


def _same(a, b, rtol: float, atol: float) -> bool:
    if _is_number(a) and _is_number(b):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= atol + rtol * abs(b)
    return a == b


def compare(
    a: dict[str, Any], b: dict[str, Any], rtol: float = 1e-4, atol: float = 1e-6
) -> list[Difference]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            diffs.append(Difference(key, a[key], None, "only_a"))
        elif key not in a:
            diffs.append(Difference(key, None, b[key], "only_b"))
        elif not _same(a[key], b[key], rtol, atol):
            diffs.append(Difference(key, a[key], b[key], "changed"))
    return diffs


def compare_dirs(
    dir_a: Path | str, dir_b: Path | str, rtol: float = 1e-4, atol: float = 1e-6
) -> tuple[int, list[Difference]]:
    """(number of metrics compared, differences) between two results directories."""
    a, b = collect(dir_a), collect(dir_b)
    return len(set(a) | set(b)), compare(a, b, rtol, atol)
