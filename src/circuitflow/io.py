"""Atomic writes and content hashes.

Every output goes to a temporary name in the same directory and is renamed when complete, so a
job killed mid-write (Slurm at walltime, out of memory) never leaves a file that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path | str, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix or path.suffix or ".tmp", dir=path.parent
    )
    os.close(fd)
    tmp = Path(tmp)
    # mkstemp makes the file private (0600); give it the permissions a plain open() would, so
    # colleagues on a shared cluster can read the results.
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: Path | str) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; it replaces `path` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def json_text(obj, indent: int | None = None) -> str:
    """Strict JSON (NaN and infinities become null, which every JSON reader accepts)."""
    return json.dumps(_finite(obj), indent=indent, default=_json_default, allow_nan=False)


def write_json(path: Path | str, obj) -> None:
    write_text(path, json_text(obj, indent=2) + "\n")


def _finite(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:  # numpy and torch scalars
        return _finite(obj.item())
    return obj


def _json_default(obj):
    if hasattr(obj, "item"):  # numpy and torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def write_parquet(path: Path | str, frame) -> None:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def save_figure(path: Path | str, fig, dpi: int = 120) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=Path(path).suffix.lstrip("."))
    plt.close(fig)


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: Iterable[Path | str]) -> str:
    """One hash over several files' names and contents (e.g. sharded weights)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).name.encode())
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()
