"""Checks of the files a stage reads, run before the stage starts its work.

Each check either returns what it read or raises InputError with one line that names the file
and what is wrong with it (and, where one helps, which stage to rerun); `cli.main` turns that into
exit status 2 (errors.EXIT_BAD_INPUT). The stages call these where they open their inputs:
prompts (`prompts.read_prompts`), model.json and weights (`model.load`), activation files
(`capture.files.read_activation_info`), SAE directories (`sae.files.load_sae`), checkpoints
(`sae.checkpoint.load_checkpoint`, set aside by the SAE stage when damaged), the attribution
tables interventions read (`interventions.inputs.read_attribution`) and the other stages'
files the report reads (`report.inputs`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from circuitflow.errors import InputError


def _rerun(stage: str | None) -> str:
    return f"; rerun {stage}" if stage else ""


def existing_file(path: Path | str, stage: str | None = None) -> Path:
    """`path`, refused when it is missing, not a file or empty."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: missing{_rerun(stage)}")
    if not path.is_file():
        raise InputError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file (truncated?){_rerun(stage)}")
    return path


def json_file(
    path: Path | str, keys: tuple[str, ...] = (), stage: str | None = None, what: str = "JSON"
) -> dict[str, Any]:
    """The JSON object in `path`, holding every key of `keys`."""
    path = existing_file(path, stage)
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{path}: not readable JSON ({err}){_rerun(stage)}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: not a JSON object, so no {what}{_rerun(stage)}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise InputError(f"{path}: {what} without {', '.join(missing)}{_rerun(stage)}")
    return obj


def parquet_table(
    path: Path | str, columns: tuple[str, ...] = (), stage: str | None = None, what: str = "table"
):
    """The parquet table in `path` as a DataFrame, holding every column of `columns`."""
    import pandas as pd

    path = existing_file(path, stage)
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise InputError(
            f"{path}: not a readable parquet file ({type(err).__name__}){_rerun(stage)}"
        ) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: {what} without column(s) {', '.join(missing)}{_rerun(stage)}")
    return frame


def safetensors_names(path: Path | str, stage: str | None = None) -> set[str]:
    """The tensor names of the safetensors file `path`, after checking its header (a truncated
    or overwritten file fails here, with its name, rather than deep inside a loader)."""
    from safetensors import safe_open

    path = existing_file(path, stage)
    try:
        with safe_open(path, framework="pt") as f:
            names = set(f.keys())
            for name in names:  # the header's offsets must lie inside the file
                f.get_slice(name).get_shape()
    except Exception as err:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise InputError(
            f"{path}: not a readable safetensors file ({err}){_rerun(stage)}"
        ) from None
    return names


def safetensors_shapes(path: Path | str, stage: str | None = None) -> dict[str, list[int]]:
    """Each tensor's shape in the safetensors file `path`, from its header alone (checked as
    safetensors_names checks it)."""
    from safetensors import safe_open

    safetensors_names(path, stage)
    with safe_open(existing_file(path, stage), framework="pt") as f:
        return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118


def safetensors_file(path: Path | str, stage: str | None = None):
    """Every tensor of the safetensors file `path` (CPU), refusing a damaged file."""
    from safetensors.torch import load_file

    safetensors_names(path, stage)
    try:
        return load_file(path)
    except Exception as err:  # noqa: BLE001 - e.g. data shorter than the header says
        raise InputError(
            f"{path}: not a readable safetensors file ({err}){_rerun(stage)}"
        ) from None
