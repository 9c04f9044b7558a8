"""The streaming SAE job's plan (rule train_sae_stream, `sae.source: stream`): which sites and
layers share a job (`split`; circuitflow.stream_groups picks the size), the job's peak memory
as a function of its SAE batch and its forward batch (`estimate_stream`, which the stage plans
both by), and its host memory and counted work for circuitflow.resources (the rule table).

A job holds the model, the shuffle buffer of every hook it trains (`sae.shuffle_buffer_tokens`
rows each, in `capture.dtype`, on the device), every SAE of the group with its Adam state, and
then one of two phases at a time: a training step of one SAE (its batch rows, as
sae.plan.estimate_sae_training counts them, and every hook's float32 batch), or a forward pass
that refills the buffer (memory.estimate_forward's working memory per context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from circuitflow.capture.plan import context_length
from circuitflow.description import describe
from circuitflow.memory import (
    Estimate,
    dtype_bytes,
    estimate_forward,
    load_bytes,
    model_dtype_name,
)
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.nodes import hook_name, mlp_hook
from circuitflow.perf import Work
from circuitflow.perf import sae_training_flops_per_token as sae_flops
from circuitflow.sae.plan import (
    SAE_NARROW_PER_ROW,
    SAE_OPTIMISER_COPIES,
    sae_param_bytes,
    training_batch,
)
from circuitflow.sites import dictionary_sites

if TYPE_CHECKING:
    import torch


# --- which hooks share a job ----------------------------------------------------------------------
@dataclass(frozen=True)
class StreamGroup:
    """The sites and layers one streaming job trains, deepest last: (site, layer) pairs."""

    members: tuple[tuple[str, int], ...]

    @property
    def hooks(self) -> list[str]:
        return [hook_name(site, layer) for site, layer in self.members]

    def transcoder_pairs(self, normalization="LN") -> dict[str, tuple[str, str]]:
        """Each member that is a transcoder (an MLP output, sae.kind transcoder or both) by
        hook: (MLP input on a model whose norms are `normalization`, its hook)."""
        return {mlp_hook(layer): (hook_name("mlp_in", layer, normalization), mlp_hook(layer))
                for s, layer in self.members if s == "mlp_out"}  # fmt: skip

    def read_hooks(self, kind: str, normalization="LN") -> list[str]:
        """The hooks its forward passes capture: each member's, and for transcoders
        (`sae.kind` transcoder or both) each transcoder's MLP input before its output."""
        if kind == "sae":
            return self.hooks
        pairs = self.transcoder_pairs(normalization)
        return [h for hook in self.hooks for h in pairs.get(hook, (hook,))]

    @property
    def depth(self) -> int:
        """stop_at_layer of the job's forward passes: the deepest member's layer + 1."""
        return max(layer for _, layer in self.members) + 1

    @property
    def key(self) -> str:
        """The group as the rule table reads it (`resid_post:0,resid_post:1`)."""
        return ",".join(f"{site}:{layer}" for site, layer in self.members)

    @property
    def name(self) -> str:
        """A name for its rule, log and benchmark: `resid_post_layer_3` for one member,
        `resid_post_layer_0_to_3` for one site's layers, else first and last member."""
        (s0, l0), (s1, l1) = self.members[0], self.members[-1]
        if len(self.members) == 1:
            return f"{s0}_layer_{l0}"
        if all(site == s0 for site, _ in self.members):
            return f"{s0}_layer_{l0}_to_{l1}"
        return f"{s0}_layer_{l0}_to_{s1}_layer_{l1}"

    @classmethod
    def parse(cls, key: str) -> StreamGroup:
        members = []
        for item in key.split(","):
            site, _, layer = item.partition(":")
            members.append((site, int(layer)))
        return cls(tuple(members))


def members(config: dict) -> list[tuple[str, int]]:
    """Every dictionary's (site, layer), by layer and then in the config's order of sites (a
    transcoder's, mlp_out, last: sites.dictionary_sites), as circuitflow.stream_groups splits
    them into jobs."""
    return [(site, layer) for layer in config["layers"] for site in dictionary_sites(config)]


def split(members: list[tuple[str, int]], per_job: int) -> list[StreamGroup]:
    """Consecutive groups of at most `per_job` members, as equal in size as they can be."""
    n_groups = math.ceil(len(members) / per_job)
    size, extra = divmod(len(members), n_groups)
    groups, at = [], 0
    for g in range(n_groups):
        n = size + (g < extra)
        groups.append(StreamGroup(tuple(members[at : at + n])))
        at += n
    return groups


def group_bytes(config: dict, group: StreamGroup, device: str) -> int:
    """The planned peak on the compute device of a job training `group` at the config's SAE
    batch and forward batch (`batch_contexts`, else the most it may plan)."""
    est = config_estimate(config, group, device)
    return est.total(training_batch(config), planned_batch_contexts(config))


# --- memory ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamEstimate:
    """Peak memory of a streaming job: `train` per SAE batch row, `forward` per context of a
    buffer-refilling forward pass (at the SAE batch it was made for)."""

    train: Estimate
    forward: Estimate

    def total(self, batch_size: int, batch_contexts: int) -> int:
        return max(self.train.total(batch_size), self.forward.total(batch_contexts))

    def host_peak(self, batch_size: int, batch_contexts: int) -> int:
        """What the work adds to the host's memory (a job's Slurm memory): on a GPU the token
        set and the row orders, on the CPU everything."""
        if self.train.device.startswith("cuda"):
            return self.train.buffers
        return self.total(batch_size, batch_contexts)


def estimate_stream(
    model_cfg,
    n_params: int,
    compute_dtype: torch.dtype | str,
    t: int,
    stop_at: int,
    d_sae: int,
    architecture: str,
    n_saes: int,
    buffer_rows: int,
    storage_dtype: torch.dtype | str,
    device: str,
    batch_size: int,
    trainer: str,
    token_bytes: int = 0,
    hooks_per_sae: int = 1,
) -> StreamEstimate:
    """The streaming job's peak (see the module's docstring). Counted in bytes: the model's
    weights W, each SAE's fp32 parameters P (sae.plan.sae_param_bytes) with Adam's two
    moments, the buffers (`buffer_rows` rows of d_in in `storage_dtype` per hook, and the
    int64 order their rows are drawn in, on the device and as numpy on the host: two orders
    while a buffer is refilled); in a training step one SAE's gradients and its rows' tensors
    (sae.architectures' `Architecture.wide` for `trainer`; the gpu trainer steps every SAE
    of the job at once, so its rows' tensors count `n_saes` times) plus every
    hook's float32 batch and one hook's gathered rows before they are widened; Adam's step
    (SAE_OPTIMISER_COPIES) as its own phase; in a refill, the forward pass's working memory per
    context (memory.estimate_forward, one hook's stored copy included) with the previous step's
    batches still alive. `token_bytes`: the token set's pages the job reads (memory-mapped).
    `hooks_per_sae`: 2 for transcoders, which read the MLP's input and output (a buffer and a
    batch each, joined into 2 d-wide rows)."""
    from circuitflow.sae.architectures import get

    d = model_cfg.d_model
    c, s = dtype_bytes(compute_dtype), dtype_bytes(storage_dtype)
    weights = n_params * c
    params = sae_param_bytes(d, d_sae)
    arch = get(architecture)
    wide = arch.wide(trainer) * (n_saes if trainer == "gpu" else 1)
    order = buffer_rows * 8
    n_hooks = n_saes * hooks_per_sae
    buffer = n_hooks * buffer_rows * d * s + 2 * order
    host = token_bytes + 2 * order
    cpu = not device.startswith("cuda")
    adam = 2 * params * n_saes
    batches = n_hooks * d * 4  # every hook's float32 batch, per row
    narrow = SAE_NARROW_PER_ROW + 2 * (hooks_per_sae - 1)  # a transcoder's [in | out] rows
    per_row = int((wide * d_sae + narrow * d) * 4) + batches + d * s
    optimiser = weights + buffer + adam + n_saes * params + int(SAE_OPTIMISER_COPIES * params)
    optimiser += batches * batch_size + (host if cpu else 0)
    train = Estimate(
        weights=weights + n_saes * params,
        per_context_device=per_row,
        per_context_host=0,
        buffers=host,
        device=device,
        fixed_device=buffer + adam + params,
        other_phases=(optimiser,),
        item="row",
    )
    fwd = estimate_forward(
        model_cfg, n_params, t, stop_at, n_hooks, compute_dtype, storage_dtype, device
    )
    one_copy = 0 if not cpu else t * d * s  # estimate_forward counts it on CUDA
    forward = Estimate(
        weights=weights + n_saes * params,
        per_context_device=fwd.per_context_device + one_copy + t * 8,
        per_context_host=0,
        buffers=host,
        device=device,
        fixed_device=buffer + adam + fwd.fixed_device + batches * batch_size,
        item="context",
    )
    return StreamEstimate(train, forward)


def config_estimate(config: dict, group: StreamGroup, device: str) -> StreamEstimate:
    """estimate_stream for `group` from the config alone (the model's shape, the token set's
    size, the config's SAE batch)."""
    from circuitflow.sae.config import HOOKS_READ, SAETrainConfig

    cfg = architectures.model_cfg(config)
    sae = SAETrainConfig.from_config(config)
    t = context_length(config, cfg)
    skip = int(config["capture"]["exclude_bos"])
    n_train = train_contexts(config, cfg)
    rows = min(buffer_contexts(sae.shuffle_buffer_tokens, t, skip), n_train) * (t - skip)
    n_contexts = n_train + sae.eval_contexts
    return estimate_stream(
        cfg, architectures.n_params(cfg), model_dtype_name(config, device), t, group.depth,
        describe(config).widest(group.members), sae.architecture, len(group.members), rows,
        config["capture"]["dtype"], device, training_batch(config), sae.trainer_on(device),
        token_bytes=4 * n_contexts * t, hooks_per_sae=HOOKS_READ[sae.kind],
    )  # fmt: skip


def buffer_contexts(shuffle_buffer_tokens: int, t: int, exclude_bos: bool) -> int:
    """Contexts whose rows fill the shuffle buffer: `sae.shuffle_buffer_tokens` rows, at least
    one context."""
    return max(1, shuffle_buffer_tokens // (t - int(exclude_bos)))


def train_contexts(config: dict, model_cfg=None) -> int:
    """Contexts of the token set the stream trains on: `sae.total_tokens` rows, whole contexts
    (the token set holds `sae.eval_contexts` more, held out for the evaluation)."""
    model_cfg = model_cfg or architectures.model_cfg(config)
    t = context_length(config, model_cfg)
    return math.ceil(config["sae"]["total_tokens"] / (t - int(config["capture"]["exclude_bos"])))


def planned_batch_contexts(config: dict) -> int:
    """Contexts a forward pass is planned at before the job runs: `sae.stream.batch_contexts`,
    else `capture.max_batch_size` (the most the job may plan), at most one buffer."""
    cfg = architectures.model_cfg(config)
    t = context_length(config, cfg)
    fixed = config["sae"]["stream"]["batch_contexts"]
    skip = config["capture"]["exclude_bos"]
    most = min(buffer_contexts(config["sae"]["shuffle_buffer_tokens"], t, skip),
               train_contexts(config, cfg))  # fmt: skip
    return min(fixed or config["capture"]["max_batch_size"], most)


def group_of(config: dict, job: str | None) -> StreamGroup:
    """The job's group (its key, as the rule passes it); every hook in one group when None."""
    return StreamGroup.parse(job) if job else StreamGroup(tuple(members(config)))


# --- the rule table's plan ------------------------------------------------------------------------
def job_bytes(config: dict, rule: str, device: str, job: str | None = None) -> int:
    """Host bytes of a streaming job's work: on the CPU its whole peak (estimate_stream), on a
    GPU the token set's pages and the row orders; a real model's load where that is more."""
    cfg = architectures.model_cfg(config)
    est = config_estimate(config, group_of(config, job), device)
    host = est.host_peak(training_batch(config), planned_batch_contexts(config))
    real = config["model"]["name"] != "embedded"
    return max(load_bytes(architectures.n_params(cfg)) if real else 0, host)


def job_work(config: dict, rule: str, job: str | None = None) -> Work:
    """The forward passes of the stream (every training context through the group's deepest
    layer, in the model's dtype), `sae.total_tokens` training rows for each SAE of the group
    (encoder and dense decoder, forward and backward), and each SAE's evaluation (clean,
    spliced, ablated passes over `sae.eval_contexts` contexts); the token set read from disk."""
    cfg = architectures.model_cfg(config)
    group = group_of(config, job)
    sae = config["sae"]
    t = context_length(config, cfg)
    n_contexts = train_contexts(config, cfg)
    forward = n_contexts * t * forward_flops_per_token(cfg, t, group.depth, unembed=False)
    n = len(group.members)
    width = describe(config).widest(group.members)
    training = n * sae["total_tokens"] * sae_flops(cfg.d_model, width)
    evaluation = n * 3 * sae["eval_contexts"] * t * forward_flops_per_token(cfg, t)
    dtype = model_dtype_name(config, "cuda")
    flops = {dtype: forward, "float32": training + evaluation}
    if dtype == "float32":
        flops = {"float32": forward + training + evaluation}
    return Work(flops, disk_bytes=4 * (n_contexts + sae["eval_contexts"]) * t)
