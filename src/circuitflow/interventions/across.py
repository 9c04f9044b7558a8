"""The interventions_across rule: single-head effects of every behaviour in one table and
figure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from circuitflow import inputs
from circuitflow.errors import ConfigError
from circuitflow.interventions import plots
from circuitflow.interventions.heads import heads_across_behaviours
from circuitflow.io import save_figure, write_parquet

# What heads_across_behaviours needs of each behaviour's single-head table.
ACROSS_COLUMNS = ("layer", "head", "drop_frac")


def across(
    behaviours: list[str], head_tables: list[Path | str], out: Path | str, out_figure: Path | str
) -> pd.DataFrame:
    """Single-head effects of every behaviour (`head_tables`: each behaviour's
    interventions heads.parquet, in the order of `behaviours`) in one table and figure."""
    if len(behaviours) != len(head_tables):
        raise ConfigError("--behaviours and --heads must name the same number of items")
    tables = {
        b: inputs.parquet_table(p, ACROSS_COLUMNS, "interventions", "single-head table")
        for b, p in zip(behaviours, head_tables, strict=True)
    }
    frame = heads_across_behaviours(tables)
    save_figure(out_figure, plots.heads_across(frame))
    write_parquet(out, frame)
    return frame
