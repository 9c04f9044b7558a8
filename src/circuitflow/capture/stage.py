"""The capture stage: one forward pass per batch serves every requested site and layer.

Steps: `plan` (contexts, checkpoint units, the memory plan's batch size), `open_partials`
(resume where a killed run stopped), `capture_units` (run the model, write each batch's rows,
checkpoint after every unit), then the files are finished and the run summarised. Units and
batches are fixed functions of the token set and the batch size (which the partial records), so
a resumed run writes the same bytes as an uninterrupted one. The file format is in `files.py`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from circuitflow import memory
from circuitflow.capture.config import CaptureConfig
from circuitflow.capture.files import PartialFile
from circuitflow.capture.plan import capture_estimate
from circuitflow.capture.writer import BatchWriter, Slot
from circuitflow.devices import host_tensor, upload
from circuitflow.perf import PassCounter
from circuitflow.resumable import Interrupted, sigterm_flag

log = logging.getLogger(__name__)


# --- units and shards -----------------------------------------------------------------------------
def unit_contexts(opts: CaptureConfig, context_length: int) -> int:
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


# --- plan -----------------------------------------------------------------------------------------
@dataclass
class CapturePlan:
    """What one capture job will do, fixed before anything runs."""

    start: int  # first context of the token set this job captures
    stop: int
    context_length: int
    skip: int  # 1 when BOS is left out of the stored rows
    unit: int  # contexts per checkpoint unit
    stop_at: int  # stop_at_layer: the deepest captured layer + 1
    key: str  # resume key: a partial made with other settings is started afresh
    estimate: memory.Estimate
    batch: memory.BatchPlan
    resident: int  # bytes the process held before the work (runtime, weights)

    @property
    def per_context(self) -> int:
        return self.context_length - self.skip

    @property
    def n_contexts(self) -> int:
        return self.stop - self.start

    @property
    def n_rows(self) -> int:
        return self.n_contexts * self.per_context


def plan(
    model,
    tokens: np.ndarray,
    token_meta: dict,
    layers: list[int],
    opts: CaptureConfig,
    context_range: tuple[int, int] | None = None,
) -> CapturePlan:
    """Contexts, checkpoint units, the resume key and the memory plan's batch size."""
    device = str(next(model.parameters()).device)
    start, stop = context_range or (0, len(tokens))
    context_length = int(tokens.shape[1])
    unit = unit_contexts(opts, context_length)
    stop_at = max(layers) + 1
    key = json.dumps(
        {
            "model_hash": token_meta["model_hash"],
            "token_set_hash": token_meta["token_set_hash"],
            "contexts": [start, stop],
            "unit": unit,
            "opts": {"dtype": opts.dtype, "exclude_bos": opts.exclude_bos},
        },
        sort_keys=True,
    )
    estimate = capture_estimate(
        model.cfg,
        sum(p.numel() for p in model.parameters()),
        context_length,
        stop_at,
        len(layers),
        next(model.parameters()).dtype,
        opts.dtype,
        device,
    )
    # The weights are already loaded, so what is available now excludes them: add them back,
    # since the estimate counts them. The rest of the process (runtime, libraries) is resident
    # already and reported beside the estimate.
    resident = memory.current_memory_bytes(device)
    batch = memory.plan_batch_size(
        estimate,
        opts.batch_size or opts.max_batch_size,
        opts.memory_fraction,
        available=memory.available_bytes(device) + estimate.weights,
    )
    other = max(0, resident - estimate.weights) / memory.MiB
    message = f"{batch.describe()}; plus {other:.0f} MiB runtime already resident"
    log.info("%s (%d hooks, stop_at_layer %d)", message, len(layers), stop_at)
    print(message, flush=True)
    skip = 1 if opts.exclude_bos else 0
    return CapturePlan(
        start, stop, context_length, skip, unit, stop_at, key, estimate, batch, resident
    )


# --- compute and write ----------------------------------------------------------------------------
def open_partials(p: CapturePlan, files: list[PartialFile], dtype: str) -> tuple[int, int | None]:
    """Open every partial file: (contexts all of them hold, the batch size they were made with)."""
    try:
        opened = [f.open(p.key, p.n_rows, dtype) for f in files]
    except BaseException:
        for f in files:
            f.close()
        raise
    saved = [b for _, b in opened if b]
    return min(done for done, _ in opened), (min(saved) if saved else None)


def capture_units(
    model,
    tokens: np.ndarray,
    p: CapturePlan,
    files: list[PartialFile],
    dtype: str,
    done: int,
    backoff: memory.OOMBackoff,
    progress: bool,
    counter: PassCounter | None = None,
) -> int:
    """Capture contexts `done` .. the plan's end, one checkpoint unit at a time: run the model on
    each batch (hooks registered once), hand its rows to the writer thread (writer.py), which
    writes them into every file while the next batch runs, and after each unit, once its rows
    are written, write its tokens and flush progress. SIGTERM stops after the current batch and
    raises Interrupted once the last completed unit is on disk. Returns the contexts done (all
    of them). `counter` counts each batch's forward pass, through stop_at of n_layers blocks,
    as that fraction."""
    from tqdm import tqdm

    device = str(next(model.parameters()).device)
    d_model = model.cfg.d_model
    # Sites may share a hook (mlp_in is resid_mid in a model without normalisation): a hook
    # fills the slot rows of every file it feeds.
    index: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        index.setdefault(f.hook, []).append(i)
    store = getattr(torch, dtype)
    rows = min(backoff.batch_size, p.unit) * p.per_context
    filling: list[Slot] = []  # the slot the running forward's hooks fill

    def grab(act, hook):
        stored = act[:, p.skip :].to(store)
        for i in index[hook.name]:
            filling[0].take(i, stored)

    def run_batch(a: int, b: int) -> int:
        filling[:] = [writer.slot()]
        try:
            host = host_tensor((b - a, p.context_length), torch.int64, device)
            host.numpy()[:] = tokens[a:b]
            with torch.inference_mode():
                model(upload(host, device), stop_at_layer=p.stop_at)
        except BaseException:
            writer.release(filling[0])
            raise
        if counter is not None:
            counter.forward(b - a, p.stop_at / model.cfg.n_layers)
        r0, r1 = (a - p.start) * p.per_context, (b - p.start) * p.per_context
        writer.submit(filling[0], r0, r1)
        return b - a

    def interrupted() -> Interrupted:
        return Interrupted(f"SIGTERM: progress saved at context {done} of {p.n_contexts}")

    bar = tqdm(
        total=p.n_rows,
        initial=done * p.per_context,
        unit="tok",
        unit_scale=True,
        disable=not progress,
        mininterval=1 if os.isatty(2) else 10,
        desc="capture",
    )
    hooks = [(h, grab) for h in index]
    with (
        sigterm_flag() as stop,
        model.hooks(fwd_hooks=hooks),
        bar,
        BatchWriter(files, rows, d_model, dtype, device) as writer,
    ):
        pos = p.start + done
        while pos < p.stop:
            unit_stop = min(p.stop, p.start + ((pos - p.start) // p.unit + 1) * p.unit)
            while pos < unit_stop and not stop.requested:
                a = pos
                pos += backoff.run(lambda bs, a=a, u=unit_stop: run_batch(a, min(a + bs, u)))
                bar.update((pos - a) * p.per_context)
            if pos < unit_stop:  # interrupted inside a unit: keep the last completed one
                raise interrupted()
            writer.drain()  # the unit's rows are on disk before its progress is
            unit_tokens = np.asarray(tokens[p.start + done : unit_stop])
            r0, r1 = done * p.per_context, (unit_stop - p.start) * p.per_context
            for f in files:
                f.file["tokens"][r0:r1] = unit_tokens[:, p.skip :].reshape(-1)
                f.checkpoint(unit_stop - p.start, backoff.batch_size)
            done = unit_stop - p.start
            log.info("checkpoint: %d of %d contexts", done, p.n_contexts)
            if stop.requested and pos < p.stop:
                raise interrupted()
    return done


def file_attrs(
    p: CapturePlan, token_meta: dict, opts: CaptureConfig, d_model: int, shard: tuple[int, int]
) -> dict:
    """The attrs every file of this job carries (site, layer and hook_name are added per file)."""
    return {
        "model_hash": token_meta["model_hash"],
        "token_set_hash": token_meta["token_set_hash"],
        "dtype": opts.dtype,
        "n_tokens": p.n_rows,
        "d_in": d_model,
        "context_length": p.context_length,
        "bos_excluded": bool(opts.exclude_bos),
        "bos_token_id": int(token_meta["bos_token_id"]),
        "context_start": p.start,
        "context_stop": p.stop,
        "shard": shard[0],
        "n_shards": shard[1],
    }


def cost_attrs(cost: dict) -> dict:
    """perf.PassCounter.summary as HDF5 attrs (the breakdown by part as a JSON string)."""
    by_part = json.dumps(cost["forward_equivalents_by_part"], sort_keys=True)
    return cost | {"forward_equivalents_by_part": by_part}


# --- summarise ------------------------------------------------------------------------------------
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
    cost: dict = field(default_factory=dict)  # perf.PassCounter.summary per context captured


def summarise(
    p: CapturePlan,
    n_files: int,
    d_model: int,
    dtype: str,
    resumed_from: int,
    seconds: float,
    batch_size: int,
    device: str,
    cost: dict | None = None,
) -> CaptureResult:
    new_tokens = (p.n_contexts - resumed_from) * p.per_context
    result = CaptureResult(
        n_tokens=p.n_rows,
        n_contexts=p.n_contexts,
        seconds=seconds,
        tokens_per_s=new_tokens / seconds if seconds > 0 else float("nan"),
        bytes_written=new_tokens * d_model * np.dtype(dtype).itemsize * n_files,
        batch_size=batch_size,
        resumed_from=resumed_from,
        peak_memory_mb=memory.peak_memory_bytes(device) / memory.MiB,
        estimate_mb=(p.batch.estimate_bytes + max(0, p.resident - p.estimate.weights)) / memory.MiB,
        planned_peak_mb=p.estimate.total(min(batch_size, p.unit, p.n_contexts)) / memory.MiB,
        cost=cost or {},
    )
    log.info(
        "captured %d tokens x %d hooks in %.1f s: %.0f tokens/s, %.1f MB/s written, "
        "peak memory %.0f MiB (planned %.0f MiB incl. runtime)",
        new_tokens,
        n_files,
        seconds,
        result.tokens_per_s,
        result.bytes_written / seconds / 1e6 if seconds > 0 else 0.0,
        result.peak_memory_mb,
        result.estimate_mb,
    )
    return result


# --- the whole capture ----------------------------------------------------------------------------
def capture(
    model,
    tokens: np.ndarray,
    token_meta: dict,
    targets: dict[tuple[str, int], Path | str],
    opts: CaptureConfig,
    context_range: tuple[int, int] | None = None,
    shard: tuple[int, int] = (0, 1),
    inject_oom: Callable[[int], None] | None = None,
    progress: bool = True,
) -> CaptureResult:
    """Capture every (site, layer) in `targets` over contexts `context_range` of `tokens`
    ([n_contexts, context_length] int32, BOS first) and write the HDF5 files."""
    device = str(next(model.parameters()).device)
    d_model = model.cfg.d_model
    files = [
        PartialFile(site, layer, path, d_model, model.cfg.normalization_type)
        for (site, layer), path in sorted(targets.items())
    ]
    p = plan(model, tokens, token_meta, [f.layer for f in files], opts, context_range)
    done, saved_batch = open_partials(p, files, opts.dtype)
    check_free_space(p, files, opts.dtype, done)
    resumed_from = done
    batch_size = saved_batch or (opts.batch_size or p.batch.batch_size)
    if done:
        log.info("resuming at context %d of %d (batch size %d)", done, p.n_contexts, batch_size)
    backoff = memory.OOMBackoff(batch_size, device, inject=inject_oom, stage="capture")
    counter = PassCounter()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        with counter.part("capture"):
            capture_units(model, tokens, p, files, opts.dtype, done, backoff, progress, counter)
        seconds = time.perf_counter() - t0
        # This job's passes per context it captured (a resumed job: this session's).
        cost = counter.summary(p.n_contexts - resumed_from, unit="context")
        # The file holds every context, whichever session captured it: its total is the counted
        # rate times its contexts, so a resumed file's attrs equal an uninterrupted one's.
        whole = cost | {
            "forward_equivalents_total": cost["forward_equivalents_per_prompt"] * p.n_contexts
        }
        attrs = file_attrs(p, token_meta, opts, d_model, shard) | cost_attrs(whole)
        for f in files:
            f.finish(attrs | {"site": f.site, "layer": f.layer, "hook_name": f.hook})
    finally:
        for f in files:
            f.close()
    return summarise(
        p, len(files), d_model, opts.dtype, resumed_from, seconds, backoff.batch_size, device, cost
    )


def check_free_space(p: CapturePlan, files: list[PartialFile], dtype: str, done: int) -> None:
    """Refuse to start (ENOSPC, one line via cli.main: exit 4) when the disk cannot hold the rows
    still to write. HDF5 may report a write that failed for want of space only as a warning when
    its chunk cache is evicted, so a full disk must be caught here, before the work."""
    import errno
    import shutil

    if not files:
        return
    rows = (p.n_contexts - done) * p.per_context
    chunk = files[0].file["acts"].chunks[0]  # space is taken a whole chunk at a time
    rows = (math.ceil(rows / chunk) + 1) * chunk
    need = len(files) * rows * (files[0].d_in * np.dtype(dtype).itemsize + 4)
    where = files[0].partial.parent
    free = shutil.disk_usage(where).free
    if need > free:
        raise OSError(
            errno.ENOSPC,
            f"capture needs {need / memory.MiB:.1f} MiB more under {where}, "
            f"{free / memory.MiB:.1f} MiB free",
        )


def run(
    config: dict,
    model_json: Path | str,
    tokens_npy: Path | str,
    tokens_json: Path | str,
    out_dir: Path | str,
    shard: int = 0,
    n_shards: int = 1,
) -> CaptureResult:
    """The stage: capture every configured site and layer of this shard's contexts into
    `out_dir/{site}/layer_{layer}.h5`."""
    from circuitflow.capture.tokens import read_token_set
    from circuitflow.model.load import load_model

    tokens, meta = read_token_set(tokens_npy, tokens_json)
    opts = CaptureConfig.from_dict(config["capture"])
    span = shard_range(len(tokens), unit_contexts(opts, meta["context_length"]), shard, n_shards)
    targets = {
        (site, layer): Path(out_dir) / site / f"layer_{layer}.h5"
        for site in config["sites"]
        for layer in config["layers"]
    }
    model = load_model(Path(model_json).parent, config["device"], config["model"]["dtype"])
    return capture(model, tokens, meta, targets, opts, span, shard=(shard, n_shards))
