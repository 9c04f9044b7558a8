"""The SAE stage's memory estimate and job plan (rule train_sae): the peak of its training loop
per row (`estimate_sae_training`, which the stage plans its batch by), and the job's host memory
and counted work for circuitflow.resources (the rule table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from circuitflow import dictionary_sources
from circuitflow.capture.plan import chunk_rows_for
from circuitflow.description import describe
from circuitflow.memory import (
    Estimate,
    dtype_bytes,
    estimate_forward,
    load_bytes,
    model_dtype_name,
)
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.perf import Work, sae_training_flops_per_token
from circuitflow.sae.config import HOOKS_READ
from circuitflow.sites import dictionary_kind

if TYPE_CHECKING:
    import torch

# SAE training: tensors of width d_sae per training row alive at the step's peak (each
# architecture's `wide_per_row` in circuitflow.sae.architectures), plus d_in-wide ones (input,
# reconstruction, residual, grads).
SAE_NARROW_PER_ROW = 8
# Parameters, gradients and Adam's two moments are 4 copies of the SAE's parameters; Adam's
# step holds temporaries (sqrt and quotient of the second moment) on top: 5.75 copies measured.
SAE_OPTIMISER_COPIES = 5.75
SAE_AUTO_MAX_BATCH = 16384  # sae.batch_size auto: the largest power of two up to this that fits
# Contexts a pass of a dictionary's evaluation takes (sae.metrics, every source's), which the
# plans size its memory by.
EVAL_BATCH = 16


def sae_param_bytes(d_in: int, d_sae: int, dtype_size: int = 4) -> int:
    return (2 * d_in * d_sae + 2 * d_sae + d_in) * dtype_size


def estimate_sae_training(
    d_in: int,
    d_sae: int,
    architecture: str,
    device: str,
    n_file_rows: int,
    shuffle_buffer_rows: int,
    chunk_rows: int = 4096,
    storage_dtype: torch.dtype | str = "float16",
    resident: int = 0,
    trainer: str = "saelens",
    n_files: int = 1,
) -> Estimate:
    """Peak memory of SAE training (the train_sae stage's loop) per training row.

    Device: `resident` bytes (the model, loaded for the spliced evaluation), the SAE's fp32
    parameters, gradients and Adam state (4 copies), and per row `wide_per_row` d_sae-wide
    (sae.architectures' `Architecture.wide`, by `trainer`) and SAE_NARROW_PER_ROW
    d_in-wide fp32 tensors; Adam's step (SAE_OPTIMISER_COPIES) is the other
    phase. Host: the stream's shuffle buffer (whole HDF5 chunks, at most the file) as fp32, and
    while a buffer is refilled the next one is read (stored dtype), permuted and widened beside
    it (12 bytes per element at once); on CUDA the prefetch thread's pinned batches too.
    A transcoder reads `n_files` = 2 files in lockstep (sae.data.PairedActivationStream):
    a buffer each, refilled one after the other (one refill's transient at a time), and its
    batch rows [input | target] are 2 d_in wide, split once more.
    """
    from circuitflow.sae.architectures import get

    params = sae_param_bytes(d_in, d_sae)
    arch = get(architecture)
    wide = arch.wide(trainer)
    narrow = SAE_NARROW_PER_ROW + 2 * (n_files - 1)
    per_row = int((wide * d_sae + narrow * d_in) * 4)
    block = max(1, min(chunk_rows, n_file_rows))
    rows = min(max(1, shuffle_buffer_rows // block) * block, n_file_rows)
    group = n_files * rows * d_in * 4
    # Read, permuted and widened: one file's buffer at a time (the pair refills in turn).
    refill = rows * d_in * (2 * dtype_bytes(storage_dtype) + 4)
    cuda = device.startswith("cuda")
    optimiser = resident + int(SAE_OPTIMISER_COPIES * params)
    if cuda:
        phases = (optimiser,)
        per_row_host = 5 * n_files * d_in * 4  # pinned batches queued by the prefetch thread
        host = group + refill
    else:
        phases = (optimiser + group, resident + 4 * params + group + refill)
        per_row_host = 0
        host = group
    return Estimate(
        weights=resident + params,
        per_context_device=per_row,
        per_context_host=per_row_host,
        buffers=host,
        device=device,
        fixed_device=3 * params,
        other_phases=phases,
        item="row",
    )


def training_batch(config: dict) -> int:
    """Rows a training step takes: `sae.batch_size`; `auto` planned at the largest it may pick."""
    sae = config["sae"]
    if sae["batch_size"] == "auto":
        return min(SAE_AUTO_MAX_BATCH, sae["total_tokens"])
    return int(sae["batch_size"])


def job_bytes(config: dict, rule: str, device: str, job: str | None = None) -> int:
    """Host bytes of a train_sae job's work: the training loop at the config's batch size with
    the model resident for the spliced evaluation (estimate_sae_training), or a real model's
    load where that is more. `job`: the job's site (at mlp_out with transcoders a transcoder,
    which reads two files in lockstep); the most any of the run's jobs takes when None.
    transcoder_replacement: the model, every transcoder and a batch of the evaluation (a
    forward pass to the logits, one layer's features)."""
    run = describe(config)
    cfg, n_params = run.model.cfg, run.model.n_params
    if rule == "transcoder_replacement":
        d_sae, t = run.transcoder_width, run.context_length
        est = estimate_forward(
            cfg, n_params, t, None, 1, "float32", "float32", device,
            buffers=len(run.transcoders) * sae_param_bytes(cfg.d_model, d_sae),
        )  # fmt: skip
        host = est.host_peak(EVAL_BATCH) + EVAL_BATCH * t * d_sae * 4 * 2
        return max(0 if run.model.embedded else load_bytes(n_params), host)
    sae, capture = config["sae"], config["capture"]
    n_rows = capture["n_tokens"]
    kind = sae["kind"] if job is None else dictionary_kind(config, job)
    width = run.widest(None if job is None else [(job, layer) for layer in run.layers])
    est = estimate_sae_training(
        cfg.d_model, width, sae["architecture"], device, n_rows,
        sae["shuffle_buffer_tokens"], chunk_rows_for(cfg.d_model, 2, n_rows), capture["dtype"],
        resident=n_params * dtype_bytes(model_dtype_name(config, device)),
        n_files=HOOKS_READ[kind],
    )  # fmt: skip
    work = est.host_peak(training_batch(config))
    return max(0 if run.model.embedded else load_bytes(n_params), work)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work:
    """`sae.total_tokens` training rows (encoder and dense decoder, forward and backward) read
    from the activation file, and the evaluation's passes (clean, spliced, ablated) over
    `sae.eval_contexts` contexts. transcoder_replacement: the evaluation's passes, and every
    transcoder's encoder and decoder twice (the clean run's statistics, the replaced run)."""
    run = describe(config)
    cfg, t = run.model.cfg, run.context_length
    sae = config["sae"]
    tokens = sae["total_tokens"]
    evaluation = 3 * sae["eval_contexts"] * t * forward_flops_per_token(cfg, t)
    if rule == "transcoder_replacement":
        dictionaries = sum(2 * 4.0 * cfg.d_model * d.width for d in run.transcoders)
        return Work({"float32": evaluation + sae["eval_contexts"] * t * dictionaries})
    training = tokens * sae_training_flops_per_token(cfg.d_model, run.widest())
    # A transcoder reads its input and its target.
    read = HOOKS_READ[sae["kind"]] * tokens * cfg.d_model * dtype_bytes(config["capture"]["dtype"])
    return Work({"float32": training + evaluation}, disk_bytes=read)


# Checkpoints of one SAE while it trains: its weights and Adam's two moments, and a second such
# checkpoint while the next is written (the older one is removed after).
SAE_CHECKPOINT_COPIES = 2 * 3


def disk_bytes(config: dict) -> dict[str, int]:
    """Bytes of the dictionaries (fp32 parameters, every one at its own width) and of the
    checkpoints of those trained here while every one trains at once (published dictionaries
    are evaluated, never checkpointed)."""
    run = describe(config)
    weights = sum(sae_param_bytes(run.model.d_model, d.width) for d in run.dictionaries)
    trained = sum(
        sae_param_bytes(run.model.d_model, d.width)
        for d in run.dictionaries
        if dictionary_sources.source_of(config, d.site).trains
    )
    return {"saes": weights, "sae_checkpoints": SAE_CHECKPOINT_COPIES * trained}
