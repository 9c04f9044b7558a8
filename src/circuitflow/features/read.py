"""The features stage's outputs as every other stage reads them: a feature's label as it is
shown (`shown`: the label with its held-out F1) and each folder's labels and Neuronpedia id.
No torch here: the report's pages and the graphs' readers import this, and a job that
imports torch pays seconds of CPU for it (issue 56)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from circuitflow import inputs

__all__ = ["WEAK_F1", "read_labels", "read_neuronpedia_ids", "shown"]

WEAK_F1 = 0.5  # a label below this held-out F1 is shown as weak


def shown(label: str, f1: float | None) -> str:
    """The text shown for a feature whose label is `label` with held-out F1 `f1` (None or NaN:
    unscored): `fires on "a" (F1 0.91)`, `weak (F1 0.21): fires on "a"`."""
    if not label or label == "dead":
        return label
    if f1 is None or (isinstance(f1, float) and math.isnan(f1)):
        return f"{label} (unscored)"
    if f1 < WEAK_F1:
        return f"weak (F1 {f1:.2f}): {label}"
    return f"{label} (F1 {f1:.2f})"


def read_neuronpedia_ids(folders: Sequence[Path | str]) -> dict[tuple[str, int], str]:
    """Each folder's dictionary's Neuronpedia id (summary.json's `neuronpedia_id`), keyed by
    its (site, layer), where it names one: what the attribution stages link a feature by."""
    out = {}
    for folder in map(Path, folders):
        summary = inputs.json_file(folder / "summary.json", ("site", "layer"), "features",
                                   "feature summary")  # fmt: skip
        if summary.get("neuronpedia_id"):
            out[(summary["site"], int(summary["layer"]))] = summary["neuronpedia_id"]
    return out


def read_labels(folders: Sequence[Path | str]) -> dict[tuple[str, int], dict[int, str]]:
    """Each folder's labels by feature as every place that shows a feature shows them (the
    label with its held-out F1: labels.shown), keyed by the (site, layer) its summary.json
    names: what the attribution stages put beside a feature wherever they show one."""
    out = {}
    for folder in map(Path, folders):
        summary = inputs.json_file(folder / "summary.json", ("site", "layer"), "features",
                                   "feature summary")  # fmt: skip
        table = pd.read_parquet(folder / "features.parquet")
        f1 = table["label_f1"] if "label_f1" in table else pd.Series(np.nan, index=table.index)
        labels = {
            int(feat): shown(label, float(score))
            for feat, label, score in zip(table["feature"], table["label"], f1, strict=True)
        }
        out[(summary["site"], int(summary["layer"]))] = labels
    return out
