"""The train_sae_stream stage (`sae.source: stream`): train the SAEs of a group of sites and
layers from the model's own activations, one stream of forward passes for all of them, resumably.

Steps, as in sae.stage: `resume_state` (the group's newest checkpoint, if made for this config,
token set and group: sae.lifecycle's fingerprint rule), `plan` (the SAE batch and the forward
batch, from memory where not fixed; a resumed run keeps its own), `train` (SAELens's
MultiSAETrainer stepping one of our trainers per SAE in lockstep on a
sae.stream.ModelActivationStream: ControlledSAETrainer, sae.fast's, or sae.stacked's, whose
members of one shape step as one, as sae.trainers picks; checkpoints of every SAE and the
stream position together, every `checkpoint_every_tokens` and on SIGTERM: sae.lifecycle's
cadence), then each SAE saved in SAELens's format to its own `saes/{site}/layer_{layer}/`,
reloaded and measured on the model (`metrics.json`, as train_sae writes it, with the stream's
counted forward passes; sae.lifecycle's writer). No activation file is read or written.

Checkpoint layout: `{checkpoint_dir}/step_{n}/` (sae.checkpoint) holds one tensor file with
every member's weights, Adam state, firing statistics and RNG under `{i}/...` (member i, in the
group's order) and one state.json with each member's trainer state, the stream position, the
batch sizes, the wall time and the forward passes counted so far.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sae_lens.training.multi_sae_trainer import MultiSAETrainer

from circuitflow import memory
from circuitflow.capture.config import CaptureConfig
from circuitflow.capture.tokens import last_contexts, read_token_set
from circuitflow.devices import resolve_device
from circuitflow.errors import InputError
from circuitflow.perf import PassCounter
from circuitflow.sae import architectures
from circuitflow.sae.config import HOOKS_READ, SAETrainConfig
from circuitflow.sae.lifecycle import (
    HeldOut,
    Session,
    checkpointing,
    fingerprint,
    fit,
    param_bytes,
    resume_state,
    start_clock,
    trained_metrics,
    write_trained,
)
from circuitflow.sae.metrics import as_hooked_sae_transformer
from circuitflow.sae.plan import SAE_AUTO_MAX_BATCH
from circuitflow.sae.sparsity import SparsityController
from circuitflow.sae.stream import ModelActivationStream, StreamLayout
from circuitflow.sae.stream_plan import StreamEstimate, StreamGroup, buffer_contexts
from circuitflow.sae.stream_plan import estimate_stream as _estimate_stream
from circuitflow.sae.trainer import (
    ControlledSAETrainer,
    restore,
    trainer_config,
    trainer_state,
    trainer_tensors,
)
from circuitflow.sae.trainer_choice import Choice, choose, resumed
from circuitflow.sae.trainers import build_group

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamSource:
    """What the stream reads: the token set, its training contexts (all but the held-out
    evaluation contexts at its end) and how rows are cut and stored (the capture settings)."""

    tokens: np.ndarray
    meta: dict
    n_train: int  # training contexts, tokens[0 : n_train]
    skip: int  # 1: BOS left out of the rows
    dtype: str  # rows stored as (capture.dtype)

    @property
    def rows_per_context(self) -> int:
        return int(self.tokens.shape[1]) - self.skip

    @property
    def n_tokens(self) -> int:
        """Training rows in one epoch (what trainer_config reads of an activation file)."""
        return self.n_train * self.rows_per_context


def stream_source(tokens: np.ndarray, meta: dict, capture: CaptureConfig) -> StreamSource:
    """The token set as the stream reads it; InputError when it holds no training context."""
    held_out = int(meta.get("held_out_contexts", 0))
    n_train = len(tokens) - held_out
    if n_train < 1:
        raise InputError(
            f"token set of {len(tokens)} contexts holds no training context besides its "
            f"{held_out} evaluation contexts; rerun capture_tokens"
        )
    skip = 1 if capture.exclude_bos else 0
    return StreamSource(tokens, meta, n_train, skip, capture.dtype)


def stream_fingerprint(cfg: SAETrainConfig, src: StreamSource, hooks: list[str], layout) -> str:
    """sae.lifecycle.fingerprint with what the stream trains on: the model and token set, the
    group's hooks and the stream's layout and dtype."""
    return fingerprint(cfg, src.meta["model_hash"], src.meta["token_set_hash"], hooks,
                       dataclasses.asdict(layout), src.dtype, src.skip)  # fmt: skip


# --- plan -----------------------------------------------------------------------------------------
@dataclass
class StreamPlan:
    batch_size: int
    batch_contexts: int
    layout: StreamLayout
    estimate: StreamEstimate


def estimate(model, cfg: SAETrainConfig, src: StreamSource, n_saes: int, stop_at: int,
             buffer_rows: int, device: str, batch_size: int) -> StreamEstimate:  # fmt: skip
    n_params = sum(p.numel() for p in model.parameters())
    d_sae = cfg.d_sae or cfg.expansion_factor * model.cfg.d_model
    return _estimate_stream(
        model.cfg, n_params, next(model.parameters()).dtype, int(src.tokens.shape[1]), stop_at,
        d_sae, cfg.architecture, n_saes, buffer_rows, src.dtype, device, batch_size,
        cfg.trainer_on(device), token_bytes=src.tokens.nbytes,
        hooks_per_sae=HOOKS_READ[cfg.kind],
    )  # fmt: skip


def plan(
    cfg: SAETrainConfig,
    capture: CaptureConfig,
    src: StreamSource,
    group: StreamGroup,
    model,
    device: str,
    state: dict | None,
) -> StreamPlan:
    """The batch sizes: a resumed run keeps its own; `sae.batch_size: auto` and
    `sae.stream.batch_contexts: null` are planned from the device's free memory (the model,
    loaded already, added back), the SAE batch first."""
    layout = plan_layout(cfg, src)
    n_buffer = layout.buffer_contexts
    rows = layout.group_rows
    state = state or {}
    available = memory.available_bytes(device) + param_bytes(model)
    batch = state.get("batch_size") or cfg.batch_size
    if batch == "auto":
        most = min(SAE_AUTO_MAX_BATCH, cfg.total_tokens)
        est = estimate(model, cfg, src, len(group.members), group.depth, rows, device, most)
        found = memory.plan_batch_size(est.train, most, available=available)
        log.info("sae.batch_size auto: %s", found.describe())
        batch = found.batch_size
    est = estimate(model, cfg, src, len(group.members), group.depth, rows, device, int(batch))
    contexts = state.get("batch_contexts") or cfg.stream.batch_contexts
    if contexts is None:
        most = min(capture.max_batch_size, n_buffer)
        found = memory.plan_batch_size(est.forward, most, capture.memory_fraction, available)
        log.info("sae.stream.batch_contexts: %s", found.describe())
        contexts = found.batch_size
    return StreamPlan(int(batch), int(contexts), layout, est)


# --- train ----------------------------------------------------------------------------------------
class GroupTrainer(MultiSAETrainer):
    """SAELens's MultiSAETrainer (lockstep steps on one multi-hook stream, sparsity windows,
    activation scaling and final metadata through SAETrainer's public seams) with our trainers
    in place of its per-SAE SAETrainers, so the L0 controller, the out-of-memory back-off and
    the fast trainer work as in train_sae, and with its checkpoint hook, which it calls after
    every step of every SAE, replaced by `after_step` (our checkpoints and SIGTERM)."""

    def __init__(self, cfg, trainers: dict[str, ControlledSAETrainer], data_provider, after_step):
        super().__init__(
            cfg=cfg,
            saes={name: tr.sae for name, tr in trainers.items()},
            hook_names={name: name for name in trainers},
            data_provider=data_provider,
        )
        self.trainers = trainers
        self.after_step = after_step

    def _checkpoint_if_needed(self) -> None:
        self.after_step(self)

    @torch.no_grad()
    def _update_pbar(self, step_outputs, pbar, update_interval: int = 100) -> None:
        """MultiSAETrainer's progress bar; the gpu trainer's stack shows the losses that have
        landed on the host (reading this step's would synchronise)."""
        stacks = {id(s): s for tr in self.trainers.values() if (s := getattr(tr, "stack", None))}
        if not stacks:
            return super()._update_pbar(step_outputs, pbar, update_interval)
        if self.n_training_steps % update_interval == 0:
            pbar.set_description(" / ".join(s.loss_description() for s in stacks.values()))
            pbar.update(update_interval * self.cfg.train_batch_size_samples)

    @torch.no_grad()
    def _estimate_scaling_factors(self) -> None:
        """`normalize_activations: expected_average_only_in`: each SAE's scaling factor from the
        same `n_batches_for_norm_estimate` batches, with ActivationScaler's arithmetic, one
        batch at a time: SAELens's coordinator holds them all at once (100 batches of every
        hook: 15 GB for 12 GPT-2 layers at batch 4096). The stream is then sought back to
        where the estimate started (ModelActivationStream.seek, which keeps the buffer in
        hand), so training starts at the stream's first row and trains on `sae.total_tokens`
        distinct tokens where the token set holds them. A resumed run keeps its factors."""
        needs = [
            name
            for name, tr in self.trainers.items()
            if tr.sae.cfg.normalize_activations == "expected_average_only_in"
            and tr.activation_scaler.scaling_factor is None
        ]
        if not needs:
            return
        sums = dict.fromkeys(needs, 0.0)
        count = 0
        start = self.data_provider.position
        for _ in range(self.cfg.n_batches_for_norm_estimate):
            batch = next(self.data_provider)
            for name in needs:
                norms = batch[self.hook_names[name]].norm(dim=-1)
                sums[name] += norms.float().sum().item()
            count += len(batch[self.hook_names[needs[0]]])
        self.data_provider.seek(start)
        for name in needs:
            d_in = self.trainers[name].sae.cfg.d_in
            self.trainers[name].activation_scaler.scaling_factor = d_in**0.5 / (sums[name] / count)


class PairedBatches:
    """The stream's batches with each transcoder's two hooks joined into its [input | output]
    rows (sae.transcoder.split), under the member's hook, and every other member's (an SAE
    beside the transcoders, sae.kind both) as it came; position and seek are the stream's."""

    def __init__(
        self, stream: ModelActivationStream, pairs: dict[str, tuple[str, str]], members: list[str]
    ):
        self.stream, self.pairs = stream, pairs
        self.plain = [m for m in members if m not in pairs]

    @property
    def position(self) -> int:
        return self.stream.position

    def seek(self, position: int) -> None:
        self.stream.seek(position)

    def __iter__(self) -> PairedBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = next(self.stream)
        joined = {name: torch.cat([batch[i], batch[o]], 1) for name, (i, o) in self.pairs.items()}
        return {name: batch[name] for name in self.plain} | joined


@dataclass
class GroupRun:
    trainer: GroupTrainer
    controllers: dict[str, SparsityController | None]
    stream: ModelActivationStream
    session: Session
    counter: PassCounter  # the stream's forward passes, every session's
    choice: Choice  # which trainer, and why (metrics.json's `trainer`)


def group_tensors(trainers: dict[str, ControlledSAETrainer]) -> dict[str, torch.Tensor]:
    return {f"{i}/{k}": v for i, tr in enumerate(trainers.values())
            for k, v in trainer_tensors(tr).items()}  # fmt: skip


def member_tensors(tensors: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    prefix = f"{i}/"
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def train(
    cfg: SAETrainConfig,
    src: StreamSource,
    group: StreamGroup,
    p: StreamPlan,
    model,
    device: str,
    ckpt_root: Path,
    fp: str,
    state: dict | None,
    tensors: dict[str, torch.Tensor],
) -> GroupRun:
    """Train every SAE of `group` to `cfg.total_tokens`, from the checkpoint `state` when
    given; checkpoints every `checkpoint_every_tokens`, and on SIGTERM at the next step, then
    raises Interrupted."""
    cfg = dataclasses.replace(cfg, batch_size=p.batch_size)
    trainer_cfg = trainer_config(cfg, src, device)
    coefficient = architectures.get(cfg.architecture).controlled_coefficient
    norms = model.cfg.normalization_type  # where a transcoder's input, site mlp_in, is
    counter = PassCounter()
    if state:
        counter.parts = dict(state["forward_equivalents"])
    stream = ModelActivationStream(
        model, src.tokens, group.read_hooks(cfg.kind, norms), p.layout, p.batch_size,
        p.batch_contexts, group.depth,
        skip=src.skip, dtype=src.dtype, position=state["data_position"] if state else 0,
        counter=counter,
    )  # fmt: skip
    controllers: dict[str, SparsityController | None] = {}
    pairs = group.transcoder_pairs(norms) if cfg.kind != "sae" else {}
    saes = []
    for hook in group.hooks:
        torch.manual_seed(cfg.seed)  # each SAE starts as train_sae's SAE of that hook would
        hook_in, hook_out = pairs.get(hook, (hook, ""))
        saes.append(
            architectures.build_training_sae(cfg, model.cfg.d_model, hook_in, device, hook_out)
        )
        controllers[hook] = (
            SparsityController(cfg.target_l0, cfg.l1_coefficient, cfg.controller)
            if coefficient
            else None
        )
    choice = resumed(choose(cfg, device), state)
    members = build_group(cfg, trainer_cfg, saes, list(controllers.values()), choice)
    trainers = dict(zip(group.hooks, members, strict=True))
    clock = start_clock(state)

    def group_state(gt: GroupTrainer) -> dict[str, Any]:
        return {
            "fingerprint": fp,
            "members": [trainer_state(tr, stream, clock, fp) for tr in gt.trainers.values()],
            # Saved before fit() increments the step counter.
            "n_training_steps": gt.n_training_steps + 1,
            "n_training_samples": gt.n_training_samples,
            "data_position": stream.position,
            "batch_size": p.batch_size,
            "batch_contexts": stream.batch_contexts,
            "wall_time_s": clock.elapsed(),
            "forward_equivalents": counter.parts,
            "trainer": choice.to_dict(),
        }

    with checkpointing(ckpt_root, cfg, trainer_cfg.total_training_samples, state) as ckpts:

        def after_step(gt: GroupTrainer) -> None:
            ckpts.after_step(
                gt.n_training_samples,
                gt.n_training_steps + 1,
                lambda: group_tensors(gt.trainers),
                lambda: group_state(gt),
            )

        batches = PairedBatches(stream, pairs, group.hooks) if pairs else stream
        group_trainer = GroupTrainer(trainer_cfg, trainers, batches, after_step)
        if state is not None:
            for i, tr in enumerate(trainers.values()):
                restore(tr, member_tensors(tensors, i), state["members"][i])
            group_trainer.n_training_steps = state["n_training_steps"]
            group_trainer.n_training_samples = state["n_training_samples"]
        session = fit(group_trainer, stream, device, clock)
    return GroupRun(group_trainer, controllers, stream, session, counter, choice)


# --- summarise and write --------------------------------------------------------------------------
def summarise(
    run: GroupRun,
    hook: str,
    member: tuple[str, int],
    saved_sae,
    cfg: SAETrainConfig,
    src: StreamSource,
    p: StreamPlan,
    group: StreamGroup,
    device: str,
    hooked,
) -> dict[str, Any]:
    """metrics.json of one member (`cfg` with the planned batch size): as train_sae writes it
    (sae.lifecycle.trained_metrics, measured on the token set's held-out last `eval_contexts`
    contexts), with the stream's counted forward passes (`stream`, the same for every member
    of the job)."""
    held_out = HeldOut(
        last_contexts(src.tokens, cfg.eval_contexts), bool(src.skip), int(src.meta["bos_token_id"])
    )
    planned = p.estimate.total(p.batch_size, p.batch_contexts)
    tr = run.trainer.trainers[hook]
    metrics = trained_metrics(
        tr, run.controllers[hook], run.session, cfg, saved_sae, member, hooked, held_out, device,
        planned, run.choice,
    )  # fmt: skip
    contexts_trained = tr.n_training_samples / src.rows_per_context
    return metrics | {
        "stream": {
            "members": group.hooks,
            "stop_at_layer": group.depth,
            "forward_equivalents": run.counter.total(),
            "forward_equivalents_per_context": run.counter.total() / max(contexts_trained, 1),
            "contexts_trained": contexts_trained,
            "contexts_forwarded": round(run.counter.total() * hooked.cfg.n_layers / group.depth),
            "training_contexts": src.n_train,
            "epochs": tr.n_training_samples / src.n_tokens,
            "buffer_contexts": p.layout.buffer_contexts,
            "batch_contexts": run.stream.batch_contexts,
            "batch_size": p.batch_size,
            "activation_bytes_written": 0,
        },
    }


def train_stream_group(
    tokens: np.ndarray,
    meta: dict,
    members: list[tuple[str, int]],
    outs: list[Path | str],
    cfg: SAETrainConfig,
    capture: CaptureConfig,
    model,
    checkpoint_dir: Path | str,
) -> dict[str, dict[str, Any]]:
    """Train, save and evaluate the SAE of every (site, layer) in `members` into the matching
    directory of `outs`; return each one's metrics by hook name. Resumes from the newest
    checkpoint in `checkpoint_dir`; on SIGTERM checkpoints at the next step and raises
    resumable.Interrupted."""
    if len(members) != len(outs):
        raise ValueError(f"{len(members)} members for {len(outs)} output directories")
    group = StreamGroup(tuple(members))
    ckpt_root = Path(checkpoint_dir)
    device = resolve_device(cfg.device)
    src = stream_source(tokens, meta, capture)
    fp = stream_fingerprint(cfg, src, group.hooks, plan_layout(cfg, src))
    state, tensors = resume_state(ckpt_root, fp)
    p = plan(cfg, capture, src, group, model, device, state)
    cfg = dataclasses.replace(cfg, batch_size=p.batch_size)
    run = train(cfg, src, group, p, model, device, ckpt_root, fp, state, tensors)
    hooked = as_hooked_sae_transformer(model)  # one copy for every member's evaluation
    results = {}
    for hook, member, out in zip(group.hooks, members, outs, strict=True):
        results[hook] = write_trained(
            out, "stream", run.trainer.trainers[hook], run.controllers[hook], cfg, device,
            lambda saved, hook=hook, member=member: summarise(
                run, hook, member, saved, cfg, src, p, group, device, hooked
            ),
        )  # fmt: skip
    shutil.rmtree(ckpt_root, ignore_errors=True)
    return results


def plan_layout(cfg: SAETrainConfig, src: StreamSource) -> StreamLayout:
    n_buffer = min(
        buffer_contexts(cfg.shuffle_buffer_tokens, int(src.tokens.shape[1]), bool(src.skip)),
        src.n_train,
    )
    return StreamLayout(src.n_train, src.rows_per_context, n_buffer, cfg.seed)


def run(
    config: dict,
    model_json: Path | str,
    tokens_npy: Path | str,
    tokens_json: Path | str,
    members: list[tuple[str, int]],
    outs: list[Path | str],
    checkpoint_dir: Path | str,
) -> dict[str, dict[str, Any]]:
    """The stage: `config` holds the sae and capture sections, the model, seed and device."""
    from circuitflow.model.load import load_model, read_model_json

    cfg = SAETrainConfig.from_config(config)
    capture = CaptureConfig.from_dict(config["capture"])
    tokens, meta = read_token_set(tokens_npy, tokens_json)  # refused before the model loads
    info = read_model_json(Path(model_json).parent)
    if meta.get("model_hash") != info["weights_sha256"]:
        raise InputError(f"{tokens_json}: the token set was built for another model; rerun "
                         "capture_tokens")  # fmt: skip
    model = load_model(
        Path(model_json).parent, resolve_device(cfg.device), config["model"]["dtype"]
    )
    return train_stream_group(tokens, meta, members, outs, cfg, capture, model, checkpoint_dir)
