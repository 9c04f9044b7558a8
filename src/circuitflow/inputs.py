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


def safetensors_header(
    path: Path | str, error: type[ValueError] = InputError
) -> tuple[dict[str, dict[str, Any]], int]:
    """The tensors the header of safetensors file `path` lists (8 bytes of length, then JSON;
    `__metadata__` left out), each with its dtype, shape and data_offsets, and the offset where
    their data starts; read without the tensors or torch. A header that does not fit the file,
    or a tensor whose bytes run past its end (a truncated file), is refused with `error` in one
    line naming the file (and the tensor). The one home of the format's header: the checkpoint
    and finite-weight checks and the cross-layer transcoder files read it here."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= size - 8:
                raise ValueError(f"header length {n} does not fit the file")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        for name, entry in entries.items():
            begin, end = (int(o) for o in entry["data_offsets"])
            entry["shape"] = [int(d) for d in entry["shape"]]
            if not 0 <= begin <= end or 8 + n + end > size:
                raise ValueError(f"tensor {name!r} runs past the end of the file (truncated?)")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise error(f"{path}: not a readable safetensors file ({err})") from None
    return entries, 8 + n


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


# --- weights with values no model can compute with ----------------------------------------------
# The bit layout of each floating dtype safetensors stores: (unsigned view, exponent mask,
# mantissa mask). A value is NaN or infinite when its exponent bits are all ones (NaN when its
# mantissa is not zero as well); float8 e4m3 has no infinity, only NaN (all bits but the sign).
FLOAT_BITS = {
    "F64": ("<u8", 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
    "F32": ("<u4", 0x7F800000, 0x007FFFFF),
    "F16": ("<u2", 0x7C00, 0x03FF),
    "BF16": ("<u2", 0x7F80, 0x007F),
    "F8_E5M2": ("u1", 0x7C, 0x03),
    "F8_E4M3": ("u1", 0x7F, 0x00),
}
FINITE_CHUNK_BYTES = 64 << 20  # read a tensor this much at a time: memory stays bounded


def nonfinite(path: Path | str, skip=None) -> tuple[str, int, int] | None:
    """The first tensor of the safetensors file `path` (in the file's order) holding NaN or
    infinite values: (its name, how many NaN, how many infinite); None when every value is
    finite. Reads the header, then each floating tensor's bytes a chunk at a time through a
    memory map, as unsigned integers whose exponent bits are tested: no torch, memory bounded by
    FINITE_CHUNK_BYTES whatever the model's size. Integer and boolean tensors are skipped, and
    those whose name `skip` (a predicate) accepts."""
    import numpy as np

    path = Path(path)
    header, start = safetensors_header(path)
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    data = np.memmap(path, dtype=np.uint8, mode="r") if entries else None
    for name, entry in entries:
        bits = FLOAT_BITS.get(entry["dtype"])
        if bits is None or (skip is not None and skip(name)):
            continue
        view, exponent, mantissa = bits
        itemsize = np.dtype(view).itemsize
        begin, end = (start + int(o) for o in entry["data_offsets"])
        step = max(itemsize, FINITE_CHUNK_BYTES // itemsize * itemsize)
        nan = inf = 0
        for at in range(begin, end, step):
            chunk = data[at : min(at + step, end)].view(view)
            special = (chunk & exponent) == exponent
            if not special.any():
                continue
            n_special = int(special.sum())
            if mantissa:
                n_nan = int((special & ((chunk & mantissa) != 0)).sum())
            else:  # float8 e4m3: its one special pattern is NaN
                n_nan = n_special
            nan, inf = nan + n_nan, inf + n_special - n_nan
        if nan or inf:
            return name, nan, inf
    return None


def nonfinite_line(path: Path | str, found: tuple[str, int, int]) -> str:
    """`path: tensor 'NAME' has 3 NaN values` (and infinite ones), for one-line refusals."""
    name, nan, inf = found
    counts = [f"{n} {what} value{'s' if n != 1 else ''}"
              for n, what in ((nan, "NaN"), (inf, "infinite")) if n]  # fmt: skip
    return f"{path}: tensor {name!r} has {' and '.join(counts)}"


def finite_weights(paths, key: str, error: type[ValueError] = InputError, skip=None) -> None:
    """Refuse, in one line naming `key`, the file and the tensor, weights (safetensors files)
    holding NaN or infinite values (`error`: ConfigError where the config named them; `skip`:
    as nonfinite's)."""
    for path in paths:
        if found := nonfinite(path, skip):
            raise error(f"{key}: {nonfinite_line(path, found)}")
