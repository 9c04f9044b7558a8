"""The report's one reader of other stages' files, each read checked (circuitflow.inputs): a
missing or unreadable file, or one without a key or column the page shows, stops the page with
one line naming the file and the key (InputError, exit status 2), rather than a KeyError deep in
a page or a blank cell. Each page states the keys it needs beside the code that shows them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow import inputs
from circuitflow.errors import InputError


def json_of(
    path: Path | str, keys: tuple[str, ...] = (), stage: str | None = None, what: str = "JSON"
) -> dict[str, Any]:
    """The JSON object in `path`, holding every key of `keys`; `stage` wrote it (the one line
    says to rerun it)."""
    return inputs.json_file(path, keys, stage, what)


def optional_json_of(
    path: Path | str, keys: tuple[str, ...] = (), stage: str | None = None, what: str = "JSON"
) -> dict[str, Any] | None:
    """As `json_of`, or None where `path` does not exist (a file the page can do without)."""
    return json_of(path, keys, stage, what) if Path(path).exists() else None


def table_of(
    path: Path | str, columns: tuple[str, ...] = (), stage: str | None = None, what: str = "table"
) -> pd.DataFrame:
    """The parquet table in `path`, holding every column of `columns`."""
    return inputs.parquet_table(path, columns, stage, what)


def entry_of(
    path: Path | str, entry: dict[str, Any], keys: tuple[str, ...], what: str
) -> dict[str, Any]:
    """`entry`, one record inside the file `path` (`what` names it), holding every key of
    `keys`."""
    missing = [k for k in keys if k not in entry]
    if missing:
        raise InputError(f"{path}: {what} without {', '.join(missing)}")
    return entry
