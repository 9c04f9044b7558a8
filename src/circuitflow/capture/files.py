"""The activation file format (HDF5) and its one reader and its writers.

For each (site, layer) the capture stage writes `activations/{site}/layer_{layer}.h5`:

* dataset `acts` [n_tokens, d_in] (chunked; float16 by default, float32 on request) and
  `tokens` [n_tokens] int32 in context order;
* attrs `hook_name`, `layer`, `site`, `model_hash`, `token_set_hash`, `dtype`, `n_tokens`,
  `d_in`, `context_length` (BOS included), `bos_excluded` (when true, the contexts are
  `tokens.reshape(-1, context_length - 1)` with BOS prepended), `bos_token_id`,
  `context_start`/`context_stop` (the token set's contexts this file holds), `shard`,
  `n_shards`, and `complete`, written last.

Work goes into `<output>.partial` beside each output (not a declared Snakemake output, so
`--rerun-incomplete` leaves it alone). Its data space is allocated up front and a progress attr
is flushed after every checkpoint unit, so a run killed by SIGKILL or SIGTERM resumes from the
last completed unit. The partial is renamed onto the output once `complete` is set.

Every stage that reads an activation file goes through `open_activations` (or
`read_activation_info`), which refuses incomplete or inconsistent files in one line naming them.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from circuitflow.capture.plan import chunk_rows_for
from circuitflow.errors import ActivationFileError
from circuitflow.io import atomic_path
from circuitflow.nodes import hook_name, hook_names

log = logging.getLogger(__name__)
PARTIAL_SUFFIX = ".partial"
_RESUME_ATTRS = ("resume_key", "done_contexts", "batch_size")
REQUIRED_ATTRS = (
    "hook_name",
    "layer",
    "site",
    "model_hash",
    "token_set_hash",
    "dtype",
    "n_tokens",
    "d_in",
    "context_length",
    "bos_excluded",
    "bos_token_id",
    "complete",
)


def partial_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


# --- the partial files ----------------------------------------------------------------------------
def _create_preallocated(f: h5py.File, name: str, shape, dtype, chunks) -> None:
    """A chunked dataset whose space is allocated now and never filled: later writes change only
    raw data, no HDF5 metadata, so a kill between flushes cannot corrupt the file's structure."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk(chunks)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dcpl.set_obj_track_times(False)  # no creation time in its header: a rerun writes the same bytes
    space = h5py.h5s.create_simple(shape)
    h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(np.dtype(dtype)), space, dcpl=dcpl)


class PartialFile:
    """One (site, layer) output and its partial file, written in place as capture proceeds."""

    def __init__(self, site: str, layer: int, path: Path, d_in: int, normalization="LN"):
        self.site, self.layer, self.path, self.d_in = site, layer, Path(path), d_in
        self.hook = hook_name(site, layer, normalization)  # the model's own (mlp_in differs)
        self.partial = partial_path(self.path)
        self.file: h5py.File | None = None

    def open(self, key: str, n_rows: int, dtype: str) -> tuple[int, int | None]:
        """Open (resuming when the partial matches `key`) -> (done contexts, batch size)."""
        itemsize = np.dtype(dtype).itemsize
        chunk = chunk_rows_for(self.d_in, itemsize, n_rows)
        cache = dict(rdcc_nbytes=8 * chunk * self.d_in * itemsize, rdcc_nslots=1009)
        if self.partial.exists():
            try:
                f = h5py.File(self.partial, "r+", **cache)
                if f.attrs.get("resume_key") == key and f["acts"].shape == (n_rows, self.d_in):
                    self.file = f
                    batch = int(f.attrs["batch_size"]) or None
                    return int(f.attrs["done_contexts"]), batch
                f.close()
                log.info("%s: made with other settings; starting afresh", self.partial)
            except (OSError, KeyError) as err:
                log.warning("%s: unreadable (%s); starting afresh", self.partial, err)
            self.partial.unlink()
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        f = h5py.File(self.partial, "w", **cache)
        _create_preallocated(f, "acts", (n_rows, self.d_in), dtype, (chunk, self.d_in))
        _create_preallocated(f, "tokens", (n_rows,), np.int32, (min(n_rows, max(chunk, 1024)),))
        f.attrs["resume_key"] = key
        f.attrs["done_contexts"] = 0
        f.attrs["batch_size"] = 0
        f.attrs["complete"] = False
        f.flush()
        self.file = f
        return 0, None

    def checkpoint(self, done: int, batch_size: int) -> None:
        self.file.attrs["done_contexts"] = done
        self.file.attrs["batch_size"] = batch_size
        self.file.flush()

    def finish(self, attrs: dict) -> None:
        f = self.file
        for name in _RESUME_ATTRS:
            del f.attrs[name]
        for name, value in attrs.items():
            f.attrs[name] = value
        f.attrs["complete"] = True  # last: a reader trusts nothing without it
        f.close()
        self.file = None
        os.replace(self.partial, self.path)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


# --- reading --------------------------------------------------------------------------------------
def open_activations(path: Path | str) -> h5py.File:
    """Open a capture output read-only, refusing (ActivationFileError naming the file) anything
    incomplete or inconsistent. Use as `with open_activations(p) as f: f["acts"] ...`."""
    path = Path(path)
    if not path.is_file():
        raise ActivationFileError(f"{path}: activation file does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise ActivationFileError(f"{path}: not a readable HDF5 file ({err})") from None
    try:
        _check(f, path)
    except BaseException:
        f.close()
        raise
    return f


def _check(f: h5py.File, path: Path) -> None:
    def bad(why: str):
        raise ActivationFileError(f"{path}: {why}; rerun the capture stage")

    if f.attrs.get("complete") is not np.True_ and f.attrs.get("complete") is not True:
        bad("incomplete activation file (attr 'complete' is not true)")
    missing = [a for a in REQUIRED_ATTRS if a not in f.attrs]
    if missing or "acts" not in f or "tokens" not in f:
        bad(f"malformed activation file (missing {missing or 'datasets acts/tokens'})")
    a = f.attrs
    n, d = int(a["n_tokens"]), int(a["d_in"])
    if f["acts"].shape != (n, d):
        bad(f"acts has shape {f['acts'].shape}, attrs say ({n}, {d})")
    if f["tokens"].shape != (n,) or f["tokens"].dtype != np.int32:
        bad(f"tokens must be int32 of shape ({n},), found {f['tokens'].dtype} {f['tokens'].shape}")
    if str(f["acts"].dtype) != str(a["dtype"]):
        bad(f"acts dtype {f['acts'].dtype} disagrees with attr dtype {a['dtype']}")
    try:
        expected = hook_names(str(a["site"]), int(a["layer"]))
    except ValueError:
        expected = ()
    if a["hook_name"] not in expected:
        bad(f"hook_name {a['hook_name']} disagrees with site {a['site']} and layer {a['layer']}")
    per_context = int(a["context_length"]) - (1 if a["bos_excluded"] else 0)
    if per_context < 1 or n % per_context:
        bad(f"{n} tokens are not whole contexts of {per_context}")


@dataclass(frozen=True)
class ActivationFileInfo:
    """The attributes of an activation file that training and evaluation rely on."""

    path: Path
    hook_name: str
    layer: int
    site: str
    model_hash: str
    token_set_hash: str
    n_tokens: int
    d_in: int
    context_length: int
    bos_excluded: bool
    bos_token_id: int
    chunk_rows: int


def read_activation_info(path: str | Path) -> ActivationFileInfo:
    """Validate an activation file and return its attributes (ActivationFileError naming the
    file unless the checks of open_activations pass)."""
    path = Path(path)
    with open_activations(path) as f:
        acts = f["acts"]
        n_tokens, d_in = acts.shape
        chunk_rows = acts.chunks[0] if acts.chunks else 4096
        return ActivationFileInfo(
            path=path,
            hook_name=str(f.attrs["hook_name"]),
            layer=int(f.attrs["layer"]),
            site=str(f.attrs["site"]),
            model_hash=str(f.attrs["model_hash"]),
            token_set_hash=str(f.attrs["token_set_hash"]),
            n_tokens=int(n_tokens),
            d_in=int(d_in),
            context_length=int(f.attrs["context_length"]),
            bos_excluded=bool(f.attrs["bos_excluded"]),
            bos_token_id=int(f.attrs["bos_token_id"]),
            chunk_rows=int(chunk_rows),
        )


def check_pair(info_in: ActivationFileInfo, info_out: ActivationFileInfo) -> None:
    """Refuse two activation files that are not one capture's rows of the same tokens."""
    for key in ("n_tokens", "chunk_rows", "token_set_hash", "model_hash", "layer"):
        a, b = getattr(info_in, key), getattr(info_out, key)
        if a != b:
            raise ActivationFileError(
                f"{info_in.path} and {info_out.path}: {key} differs ({a} vs {b}); a transcoder "
                "trains on one capture's input and output rows of the same tokens"
            )


# --- writing whole files --------------------------------------------------------------------------
def merged_cost(files: list[h5py.File], attrs) -> dict:
    """The shards' forward-pass equivalents (capture's cost attrs) summed, per merged context."""
    total = sum(float(f.attrs["forward_equivalents_total"]) for f in files)
    parts: dict[str, float] = {}
    for f in files:
        per, shard_total = (
            float(f.attrs[k])
            for k in ("forward_equivalents_per_prompt", "forward_equivalents_total")
        )
        for k, v in json.loads(str(f.attrs["forward_equivalents_by_part"])).items():
            parts[k] = parts.get(k, 0.0) + (v / per * shard_total if per else 0.0)
    n = max(1, int(attrs["context_stop"]) - int(attrs["context_start"]))
    return {
        "forward_equivalents_per_prompt": total / n,
        "forward_equivalents_by_part": json.dumps({k: v / n for k, v in parts.items()}),
        "forward_equivalents_total": total,
        "forward_equivalents_unit": "context",
    }


def merge_shards(shard_paths: list[Path | str], out: Path | str) -> None:
    """Concatenate complete shard files (in order) into one output, chunk by chunk."""
    files = [open_activations(p) for p in shard_paths]
    try:
        first = files[0].attrs
        same = ("hook_name", "model_hash", "token_set_hash", "dtype", "d_in", "context_length")
        for p, f in zip(shard_paths, files, strict=True):
            for k in (*same, "bos_excluded", "bos_token_id"):
                if f.attrs[k] != first[k]:
                    raise ActivationFileError(f"{p}: attr {k} differs from {shard_paths[0]}")
        for i in range(1, len(files)):
            if int(files[i].attrs["context_start"]) != int(files[i - 1].attrs["context_stop"]):
                raise ActivationFileError(f"{shard_paths[i]}: does not continue the previous shard")
        n = sum(int(f.attrs["n_tokens"]) for f in files)
        d = int(first["d_in"])
        dtype = np.dtype(str(first["dtype"]))
        chunk = files[0]["acts"].chunks or (chunk_rows_for(d, dtype.itemsize, n), d)
        with atomic_path(out) as tmp:
            with h5py.File(tmp, "w") as g:
                acts = g.create_dataset("acts", (n, d), dtype=dtype, chunks=(min(chunk[0], n), d))
                toks = g.create_dataset("tokens", (n,), dtype=np.int32)
                row = 0
                step = chunk[0] * 16
                for f in files:
                    m = int(f.attrs["n_tokens"])
                    for r in range(0, m, step):
                        s = min(step, m - r)
                        acts[row + r : row + r + s] = f["acts"][r : r + s]
                    toks[row : row + m] = f["tokens"][:]
                    row += m
                for k, v in first.items():
                    if k != "complete":
                        g.attrs[k] = v
                g.attrs["n_tokens"] = n
                g.attrs["context_start"] = int(files[0].attrs["context_start"])
                g.attrs["context_stop"] = int(files[-1].attrs["context_stop"])
                g.attrs["shard"] = 0
                g.attrs["n_shards"] = 1
                if all("forward_equivalents_total" in f.attrs for f in files):
                    g.attrs.update(merged_cost(files, g.attrs))
                g.attrs["complete"] = True
    finally:
        for f in files:
            f.close()


def write_activation_file(
    path: str | Path,
    acts: np.ndarray,
    tokens: np.ndarray,
    attrs: dict[str, object],
    chunk_rows: int = 4096,
) -> None:
    """Write a whole file in the capture format at once (synthetic data, tests, benchmarks);
    `complete` is set last and the file renamed into place, as the capture stage does."""
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            chunks = (min(chunk_rows, len(acts)), acts.shape[1])
            f.create_dataset("acts", data=acts, chunks=chunks)
            f.create_dataset("tokens", data=tokens.astype(np.int32))
            for key, value in attrs.items():
                f.attrs[key] = value
            f.attrs["n_tokens"] = len(acts)
            f.attrs["d_in"] = acts.shape[1]
            f.attrs["dtype"] = str(acts.dtype)
            f.attrs["complete"] = True
