"""The capture stage's job plans (rules capture_tokens, capture, capture_shard, merge_capture):
host memory and counted work of the run as circuitflow.description describes it (the model's
shape, the context length, the token set's size), for circuitflow.resources (the rule table)."""

from __future__ import annotations

import dataclasses
import math

from circuitflow import description, dictionary_sources
from circuitflow.description import describe
from circuitflow.memory import (
    Estimate,
    MiB,
    capture_hooks,
    dtype_bytes,
    estimate_forward,
    load_bytes,
    model_dtype_name,
)
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.perf import Work

# Tokenising the corpus (capture_tokens): a fast tokenizer does ~1M tokens/s a core.
TOKENIZE_TOKENS_PER_S = 1e5
# The capture writer's cache per captured hook (files.ActivationWriter's chunk cache).
WRITE_BUFFER_BYTES = 8 * MiB
CHUNK_BYTES = 1 << 20  # target HDF5 chunk size of the activation files (capture/files.py)
# Batches whose rows are on the host at once: the one the forward fills and the one the writer
# thread writes (capture/writer.py's slots).
HOST_BATCHES = 2


def capture_estimate(
    model_cfg, n_params: int, context_length: int, stop_at: int, n_hooks: int,
    compute_dtype, storage_dtype, device: str,
) -> Estimate:  # fmt: skip
    """The capture job's memory: a forward pass through `stop_at` blocks (estimate_forward)
    with HOST_BATCHES batches of every hook's rows on the host and each file's write cache."""
    est = estimate_forward(
        model_cfg, n_params, context_length, stop_at, n_hooks, compute_dtype, storage_dtype,
        device, buffers=n_hooks * WRITE_BUFFER_BYTES,
    )  # fmt: skip
    return dataclasses.replace(est, per_context_host=HOST_BATCHES * est.per_context_host)


def chunk_rows_for(d_in: int, itemsize: int, n_rows: int) -> int:
    """Rows of an activation file's HDF5 chunk: about CHUNK_BYTES, a power of two (at least 64),
    at most the file's rows. Here, not in capture/files.py (h5py): the SAE plan reads it."""
    rows = 1 << max(6, int(math.log2(max(1, CHUNK_BYTES // (d_in * itemsize)))))
    return max(1, min(rows, n_rows))


def context_length(config: dict, model_cfg) -> int:
    """Tokens of a capture context, BOS included (description.context_length)."""
    n_ctx = getattr(model_cfg, "n_ctx", description.REAL_CONTEXT)
    return description.context_length(config, n_ctx)


def contexts(config: dict, model_cfg) -> tuple[int, int, int]:
    """(context length, rows stored a context, contexts) of the capture: `capture.n_tokens`
    rows, BOS left out of each context unless `capture.exclude_bos` is false."""
    t = context_length(config, model_cfg)
    per_context = t - 1 if config["capture"]["exclude_bos"] else t
    return t, per_context, math.ceil(config["capture"]["n_tokens"] / per_context)


def token_set_contexts(config: dict) -> int:
    """Contexts of the token set capture_tokens builds, as the run's description counts them
    (description.token_set_contexts), without describing the whole run: the config check
    asks before the published dictionaries it would read are checked."""
    cfg = architectures.model_cfg(config)
    return description.token_set_contexts(config, context_length(config, cfg))


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of a capture job's work at the config's batch size: the token set (two int64
    copies) for capture_tokens; the forward pass with two batches of every hook's rows for
    capture (capture_estimate), or a real model's load where that is more."""
    capture = config["capture"]
    run = describe(config)
    cfg, t = run.model.cfg, run.context_length
    n_rows = capture["n_tokens"]
    if rule == "capture_tokens":
        if dictionary_sources.token_set_source(config).trains_on_token_set:
            n_rows = run.token_set_contexts * t
        return 2 * 8 * n_rows
    if rule not in ("capture", "capture_shard"):
        return 0
    hooks = capture_hooks(config)
    dtype = model_dtype_name(config, device)
    est = capture_estimate(cfg, run.model.n_params, t, cfg.n_layers, hooks, dtype,
                           capture["dtype"], device)  # fmt: skip
    n_contexts = -(-n_rows // (t - 1))
    batch = min(capture["batch_size"] or capture["max_batch_size"], n_contexts)
    return max(0 if run.model.embedded else load_bytes(run.model.n_params), est.host_peak(batch))


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work | None:
    """capture_tokens: tokenising the contexts; capture (a shard: its share): a forward pass of
    every context through the deepest captured layer, and every hook's rows written."""
    run = describe(config)
    cfg = run.model.cfg
    capture = config["capture"]
    t, per_context, n_contexts = contexts(config, cfg)
    if rule == "capture_tokens":
        return Work({}, other_seconds=run.token_set_contexts * t / TOKENIZE_TOKENS_PER_S)
    if rule not in ("capture", "capture_shard"):
        return None
    shards = capture["shards"] if rule == "capture_shard" else 1
    depth = max(config["layers"]) + 1
    flops = n_contexts * t * forward_flops_per_token(cfg, t, depth, unembed=False) / shards
    itemsize = dtype_bytes(capture["dtype"])
    written = n_contexts * per_context * capture_hooks(config) * cfg.d_model * itemsize / shards
    dtype = model_dtype_name(config, "cuda")
    return Work({dtype: flops}, disk_bytes=written)


def disk_bytes(config: dict) -> int:
    """Bytes of the activation files (rows x (d_in in the capture dtype + an int32 token), every
    hook; none unless the dictionary source reads them: `sae.source: capture`) and the token set
    (int32 rows, and its hash's copy)."""
    run = describe(config)
    rows = config["capture"]["n_tokens"]
    row = run.model.d_model * dtype_bytes(config["capture"]["dtype"]) + 4
    if not dictionary_sources.run_reads_activation_files(config):
        return 4 * 2 * run.token_set_contexts * run.context_length
    return capture_hooks(config) * rows * row + 4 * 2 * rows
