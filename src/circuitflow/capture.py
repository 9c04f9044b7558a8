"""Activation capture: one forward pass per batch serves every requested site and layer.

For each (site, layer) the stage writes `activations/{site}/layer_{layer}.h5`:

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
last completed unit. Units and batches are fixed functions of the token set and the batch size
(which the partial records), so a resumed run writes the same bytes as an uninterrupted one.
The partial is renamed onto the output once `complete` is set.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from circuitflow import memory
from circuitflow.io import atomic_path

log = logging.getLogger(__name__)
SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
STORAGE_DTYPES = ("float16", "float32")
PARTIAL_SUFFIX = ".partial"
CHUNK_BYTES = 1 << 20  # target HDF5 chunk size
EXIT_CHECKPOINTED = 75  # SIGTERM: progress saved, rerun resumes (as train_sae does)
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


class ActivationFileError(ValueError):
    """An activation file no stage may consume (incomplete, malformed)."""


class Interrupted(Exception):
    """SIGTERM arrived; progress up to the last completed unit is on disk."""


def hook_name(site: str, layer: int) -> str:
    if site not in SITES:
        raise ValueError(f"sites: {site!r} is not allowed; allowed values: {', '.join(SITES)}")
    return f"blocks.{layer}.hook_{site}"


def output_path(outdir: Path | str, site: str, layer: int) -> Path:
    return Path(outdir) / "activations" / site / f"layer_{layer}.h5"


def partial_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


@dataclass(frozen=True)
class CaptureOptions:
    """The `capture` config section's run-time settings."""

    dtype: str = "float16"
    exclude_bos: bool = True
    checkpoint_tokens: int = 65536
    batch_size: int | None = None  # None: planned from memory
    max_batch_size: int = 256
    memory_fraction: float = 0.8

    @classmethod
    def from_config(cls, capture: dict) -> CaptureOptions:
        return cls(**{k: capture[k] for k in cls.__dataclass_fields__ if k in capture})


# --- units and shards -----------------------------------------------------------------------------
def unit_contexts(opts: CaptureOptions, context_length: int) -> int:
    """Contexts per checkpoint unit (progress is flushed after each)."""
    per_context = context_length - 1 if opts.exclude_bos else context_length
    return max(1, math.ceil(opts.checkpoint_tokens / per_context))


def shard_range(n_contexts: int, unit: int, shard: int, n_shards: int) -> tuple[int, int]:
    """Shard `shard` of `n_shards`: a run of whole units, so sharded and unsharded runs batch the
    same contexts together and write the same bytes."""
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is outside 0-{n_shards - 1}")
    n_units = math.ceil(n_contexts / unit)
    if n_shards > n_units:
        raise ValueError(
            f"capture.shards: {n_shards} shards for {n_units} checkpoint units; use at most "
            f"{n_units} shards or a smaller capture.checkpoint_tokens"
        )
    lo, hi = shard * n_units // n_shards, (shard + 1) * n_units // n_shards
    return lo * unit, min(hi * unit, n_contexts)


# --- the partial files ----------------------------------------------------------------------------
def chunk_rows_for(d_in: int, itemsize: int, n_rows: int) -> int:
    rows = 1 << max(6, int(math.log2(max(1, CHUNK_BYTES // (d_in * itemsize)))))
    return max(1, min(rows, n_rows))


def _create_preallocated(f: h5py.File, name: str, shape, dtype, chunks) -> None:
    """A chunked dataset whose space is allocated now and never filled: later writes change only
    raw data, no HDF5 metadata, so a kill between flushes cannot corrupt the file's structure."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk(chunks)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    space = h5py.h5s.create_simple(shape)
    h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(np.dtype(dtype)), space, dcpl=dcpl)


class _Target:
    """One (site, layer) output and its partial file."""

    def __init__(self, site: str, layer: int, path: Path, d_in: int):
        self.site, self.layer, self.path, self.d_in = site, layer, Path(path), d_in
        self.hook = hook_name(site, layer)
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


# --- capture --------------------------------------------------------------------------------------
@dataclass
class CaptureResult:
    n_tokens: int
    n_contexts: int
    seconds: float
    tokens_per_s: float
    bytes_written: int
    batch_size: int
    resumed_from: int
    peak_memory_mb: float
    estimate_mb: float
    planned_peak_mb: float = 0.0  # the memory plan's estimate at the largest batch run


def _sigterm_flag() -> tuple[dict, Callable[[], None]]:
    state = {"term": False}
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):  # noqa: ARG001
        state["term"] = True

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave the default behaviour
        return state, lambda: None
    return state, lambda: signal.signal(signal.SIGTERM, previous)


def capture(
    model,
    tokens: np.ndarray,
    token_meta: dict,
    targets: dict[tuple[str, int], Path | str],
    opts: CaptureOptions,
    context_range: tuple[int, int] | None = None,
    shard: tuple[int, int] = (0, 1),
    inject_oom: Callable[[int], None] | None = None,
    progress: bool = True,
) -> CaptureResult:
    """Capture every (site, layer) in `targets` over contexts `context_range` of `tokens`
    ([n_contexts, context_length] int32, BOS first) and write the HDF5 files."""
    if opts.dtype not in STORAGE_DTYPES:
        raise ValueError(f"capture.dtype: {opts.dtype!r}; allowed values: float16, float32")
    device = str(next(model.parameters()).device)
    start, stop = context_range or (0, len(tokens))
    context_length = int(tokens.shape[1])
    skip = 1 if opts.exclude_bos else 0
    per_context = context_length - skip
    n_rows = (stop - start) * per_context
    unit = unit_contexts(opts, context_length)
    d_model = model.cfg.d_model
    outs = [_Target(site, layer, path, d_model) for (site, layer), path in sorted(targets.items())]
    stop_at = max(t.layer for t in outs) + 1
    key = json.dumps(
        {
            "model_hash": token_meta["model_hash"],
            "token_set_hash": token_meta["token_set_hash"],
            "contexts": [start, stop],
            "unit": unit,
            "opts": {k: v for k, v in asdict(opts).items() if k in ("dtype", "exclude_bos")},
        },
        sort_keys=True,
    )

    # Plan memory before anything runs.
    compute_dtype = next(model.parameters()).dtype
    n_params = sum(p.numel() for p in model.parameters())
    cache_bytes = sum(8 * CHUNK_BYTES for _ in outs)
    estimate = memory.estimate_forward(
        model.cfg,
        n_params,
        context_length,
        stop_at,
        len(outs),
        compute_dtype,
        opts.dtype,
        device,
        buffers=cache_bytes,
    )
    # The weights are already loaded, so what is available now excludes them: add them back,
    # since the estimate counts them. The rest of the process (runtime, libraries) is resident
    # already and reported beside the estimate.
    resident = memory.current_memory_bytes(device)
    plan = memory.plan_batch_size(
        estimate,
        opts.batch_size or opts.max_batch_size,
        opts.memory_fraction,
        available=memory.available_bytes(device) + estimate.weights,
    )
    other = max(0, resident - estimate.weights) / memory.MiB
    message = f"{plan.describe()}; plus {other:.0f} MiB runtime already resident"
    log.info("%s (%d hooks, stop_at_layer %d)", message, len(outs), stop_at)
    print(message, flush=True)

    done, saved_batch = 0, None
    try:
        opened = [t.open(key, n_rows, opts.dtype) for t in outs]
        done = min(d for d, _ in opened)
        saved = [b for _, b in opened if b]
        saved_batch = min(saved) if saved else None
    except BaseException:
        for t in outs:
            t.close()
        raise
    batch_size = saved_batch or (opts.batch_size or plan.batch_size)
    if done:
        log.info("resuming at context %d of %d (batch size %d)", done, stop - start, batch_size)
    backoff = memory.OOMBackoff(batch_size, device, inject=inject_oom)

    hooks_by_name = {t.hook: t for t in outs}
    captured: dict[str, np.ndarray] = {}
    np_dtype = getattr(torch, opts.dtype)

    def grab(act, hook):
        captured[hook.name] = act[:, skip:].to(np_dtype).to("cpu").numpy()

    fwd_hooks = [(name, grab) for name in hooks_by_name]
    bytes_per_row = d_model * np.dtype(opts.dtype).itemsize

    def run_batch(a: int, b: int) -> int:
        captured.clear()
        batch = torch.from_numpy(np.asarray(tokens[a:b], dtype=np.int64)).to(device)
        with torch.inference_mode():
            model(batch, stop_at_layer=stop_at)
        r0, r1 = (a - start) * per_context, (b - start) * per_context
        for name, t in hooks_by_name.items():
            t.file["acts"][r0:r1] = captured[name].reshape(-1, d_model)
        return b - a

    term, restore = _sigterm_flag()
    stack = contextlib.ExitStack()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    from tqdm import tqdm

    bar = tqdm(
        total=n_rows,
        initial=done * per_context,
        unit="tok",
        unit_scale=True,
        disable=not progress,
        mininterval=1 if os.isatty(2) else 10,
        desc="capture",
    )
    t0 = time.perf_counter()
    resumed_from = done
    try:
        hooks = model.hooks(fwd_hooks=fwd_hooks)  # registered once for the whole run
        stack.enter_context(hooks)
        pos = start + done
        while pos < stop:
            unit_stop = min(stop, start + ((pos - start) // unit + 1) * unit)
            while pos < unit_stop:
                a = pos
                pos += backoff.run(lambda bs, a=a, u=unit_stop: run_batch(a, min(a + bs, u)))
                bar.update((pos - a) * per_context)
                if term["term"]:
                    break
            if pos < unit_stop:  # interrupted inside a unit: keep the last completed one
                raise Interrupted(
                    f"SIGTERM: progress saved at context {done} of {stop - start}; rerun resumes"
                )
            unit_tokens = np.asarray(tokens[start + done : unit_stop])
            r0, r1 = done * per_context, (unit_stop - start) * per_context
            for t in outs:
                t.file["tokens"][r0:r1] = unit_tokens[:, skip:].reshape(-1)
                t.checkpoint(unit_stop - start, backoff.batch_size)
            done = unit_stop - start
            log.info("checkpoint: %d of %d contexts", done, stop - start)
            if term["term"] and pos < stop:
                raise Interrupted(
                    f"SIGTERM: progress saved at context {done} of {stop - start}; rerun resumes"
                )
        seconds = time.perf_counter() - t0
        attrs = {
            "site": None,
            "layer": None,
            "hook_name": None,
            "model_hash": token_meta["model_hash"],
            "token_set_hash": token_meta["token_set_hash"],
            "dtype": opts.dtype,
            "n_tokens": n_rows,
            "d_in": d_model,
            "context_length": context_length,
            "bos_excluded": bool(opts.exclude_bos),
            "bos_token_id": int(token_meta["bos_token_id"]),
            "context_start": start,
            "context_stop": stop,
            "shard": shard[0],
            "n_shards": shard[1],
        }
        for t in outs:
            t.finish(attrs | {"site": t.site, "layer": t.layer, "hook_name": t.hook})
    finally:
        stack.close()
        bar.close()
        restore()
        for t in outs:
            t.close()
    new_tokens = (done - resumed_from) * per_context
    result = CaptureResult(
        n_tokens=n_rows,
        n_contexts=stop - start,
        seconds=seconds,
        tokens_per_s=new_tokens / seconds if seconds > 0 else float("nan"),
        bytes_written=new_tokens * bytes_per_row * len(outs),
        batch_size=backoff.batch_size,
        resumed_from=resumed_from,
        peak_memory_mb=memory.peak_memory_bytes(device) / memory.MiB,
        estimate_mb=(plan.estimate_bytes + max(0, resident - estimate.weights)) / memory.MiB,
        planned_peak_mb=estimate.total(min(backoff.batch_size, unit, stop - start)) / memory.MiB,
    )
    log.info(
        "captured %d tokens x %d hooks in %.1f s: %.0f tokens/s, %.1f MB/s written, "
        "peak memory %.0f MiB (planned %.0f MiB incl. runtime)",
        new_tokens,
        len(outs),
        seconds,
        result.tokens_per_s,
        result.bytes_written / seconds / 1e6 if seconds > 0 else 0.0,
        result.peak_memory_mb,
        result.estimate_mb,
    )
    return result


# --- reading and merging --------------------------------------------------------------------------
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
    if a["hook_name"] != f"blocks.{int(a['layer'])}.hook_{a['site']}":
        bad(f"hook_name {a['hook_name']} disagrees with site {a['site']} and layer {a['layer']}")
    per_context = int(a["context_length"]) - (1 if a["bos_excluded"] else 0)
    if per_context < 1 or n % per_context:
        bad(f"{n} tokens are not whole contexts of {per_context}")


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
                g.attrs["complete"] = True
    finally:
        for f in files:
            f.close()
