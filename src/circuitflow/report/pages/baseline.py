"""The baseline page: the baseline metrics of every behaviour (baseline/{behaviour}.json)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from circuitflow.report import inputs

BASELINE_COLUMNS = [
    "behaviour",
    "n_prompts",
    "logit_diff_mean",
    "logit_diff_std",
    "corrupted_logit_diff_mean",
    "accuracy",
    "top1_accuracy",
    "expected_calibration_error",
    "brier_score",
]


def baseline_table(paths: list[Path | str]) -> pd.DataFrame:
    """One row per baseline/{behaviour}.json, each holding every column."""
    rows = [
        inputs.json_of(path, tuple(BASELINE_COLUMNS), "baseline", "baseline summary")
        for path in paths
    ]
    return pd.DataFrame(rows).reindex(columns=BASELINE_COLUMNS)
