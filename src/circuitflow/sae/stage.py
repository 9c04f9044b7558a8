"""The train_sae stage: train one SAE on one layer's captured activations, resumably.

Steps: `resume_state` (the newest checkpoint, if it was made for this config and input: the
fingerprint rule of sae.lifecycle), `plan` (the batch size, from memory when `sae.batch_size:
auto`), `train` (the trainer sae.trainers picks: SAELens's, or for TopK and BatchTopK sae.fast's
or sae.stacked's, streaming batches from the HDF5 file, checkpointing every
`checkpoint_every_tokens` and on SIGTERM), then the SAE written in SAELens's format, reloaded
from disk and measured on the model (`summarise`) into metrics.json, replacing the output
directory atomically (sae.lifecycle's writer, as every source's). Checkpoints live outside the
output directory, because Snakemake deletes a `directory()` output before a retry.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitflow import memory
from circuitflow.capture.files import ActivationFileInfo
from circuitflow.devices import resolve_device
from circuitflow.sae import architectures
from circuitflow.sae import plan as sae_plan
from circuitflow.sae.config import HOOKS_READ, SAETrainConfig
from circuitflow.sae.data import ActivationStreamConfig, load_eval_contexts
from circuitflow.sae.inputs import Inputs
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
from circuitflow.sae.sparsity import SparsityController
from circuitflow.sae.trainer import (
    ControlledSAETrainer,
    restore,
    trainer_config,
    trainer_state,
    trainer_tensors,
)
from circuitflow.sae.trainer_choice import Choice, choose, resumed
from circuitflow.sae.trainers import build_trainer

log = logging.getLogger(__name__)


# --- plan -----------------------------------------------------------------------------------------
def memory_estimate(
    cfg: SAETrainConfig, info: ActivationFileInfo, device: str, resident: int = 0
) -> memory.Estimate:
    """The memory planner's estimate of this training run per batch row; `resident` is what
    already sits on the device for the run (the model, kept for the spliced evaluation)."""
    return sae_plan.estimate_sae_training(
        info.d_in,
        cfg.d_sae or cfg.expansion_factor * info.d_in,
        cfg.architecture,
        device,
        n_file_rows=info.n_tokens,
        shuffle_buffer_rows=cfg.shuffle_buffer_tokens,
        chunk_rows=info.chunk_rows,
        resident=resident,
        trainer=cfg.trainer_on(device),
        n_files=HOOKS_READ[cfg.kind],
    )


def plan_auto_batch(
    cfg: SAETrainConfig, info: ActivationFileInfo, device: str, model: Any = None
) -> memory.BatchPlan:
    """`sae.batch_size: auto`: the largest power of two up to sae_plan.SAE_AUTO_MAX_BATCH (and
    total_tokens) whose estimated peak fits in 80% of the device's memory."""
    resident = param_bytes(model) if model is not None else 0
    plan = memory.plan_batch_size(
        memory_estimate(cfg, info, device, resident),
        min(sae_plan.SAE_AUTO_MAX_BATCH, cfg.total_tokens),
        available=memory.available_bytes(device) + resident,  # the model is loaded already
    )
    log.info("sae.batch_size auto: %s", plan.describe())
    return plan


def plan(
    cfg: SAETrainConfig, info: ActivationFileInfo, device: str, model: Any, state: dict | None
) -> SAETrainConfig:
    """`cfg` with the batch size settled: a resumed run keeps the size it started with, whatever
    this device fits; `auto` is planned from memory."""
    if cfg.batch_size != "auto":
        return cfg
    batch = (state or {}).get("batch_size") or plan_auto_batch(cfg, info, device, model).batch_size
    return dataclasses.replace(cfg, batch_size=int(batch))


def capture_fingerprint(cfg: SAETrainConfig, info: ActivationFileInfo) -> str:
    """sae.lifecycle.fingerprint with what the SAE trains on: the activation file's model,
    token set, hook and rows."""
    return fingerprint(cfg, info.model_hash, info.token_set_hash, info.hook_name, info.n_tokens)


# --- train ----------------------------------------------------------------------------------------
@dataclass
class Trained:
    trainer: ControlledSAETrainer
    controller: SparsityController | None
    session: Session
    choice: Choice  # which trainer, and why (metrics.json's `trainer`)


def train(
    cfg: SAETrainConfig,
    inputs: Inputs,
    device: str,
    ckpt_root: Path,
    fp: str,
    state: dict | None,
    tensors: dict[str, torch.Tensor],
) -> Trained:
    """Train to `cfg.total_tokens`, from the checkpoint `state` when given, checkpointing as
    sae.lifecycle.checkpointing says (on SIGTERM: at the next step, then Interrupted)."""
    info = inputs.info
    torch.manual_seed(cfg.seed)
    hook_out = inputs.target.hook_name if inputs.target else ""
    sae = architectures.build_training_sae(cfg, info.d_in, info.hook_name, device, hook_out)
    trainer_cfg = trainer_config(cfg, info, device)
    coefficient = architectures.get(cfg.architecture).controlled_coefficient
    controller = (
        SparsityController(cfg.target_l0, cfg.l1_coefficient, cfg.controller)
        if coefficient
        else None
    )
    clock = start_clock(state)
    choice = resumed(choose(cfg, device), state)
    stream = inputs.stream(
        ActivationStreamConfig(
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            shuffle_buffer_tokens=cfg.shuffle_buffer_tokens,
            device=device,
        ),
        state["data_position"] if state else 0,
    )

    with checkpointing(ckpt_root, cfg, trainer_cfg.total_training_samples, state) as ckpts:

        def after_step(tr: ControlledSAETrainer) -> None:
            ckpts.after_step(
                tr.n_training_samples,
                tr.n_training_steps + 1,
                lambda: trainer_tensors(tr),
                lambda: trainer_state(tr, stream, clock, fp) | {"trainer": choice.to_dict()},
            )

        trainer = build_trainer(cfg, trainer_cfg, sae, stream, controller, after_step, choice)
        if state is not None:
            restore(trainer, tensors, state)
        session = fit(trainer, stream, device, clock)
    return Trained(trainer, controller, session, choice)


# --- summarise and write --------------------------------------------------------------------------
def summarise(
    run: Trained, saved_sae, cfg: SAETrainConfig, inputs: Inputs, device: str, model
) -> dict[str, Any]:
    """metrics.json (sae.lifecycle.trained_metrics), measured on the activation file's last
    `eval_contexts` contexts."""
    info = inputs.info
    held_out = HeldOut(
        load_eval_contexts(info, cfg.eval_contexts), info.bos_excluded, info.bos_token_id
    )
    # The planner's estimate of the training loop's peak (model, SAE, optimiser, batch).
    planned = memory_estimate(cfg, info, device, param_bytes(model)).total(int(cfg.batch_size))
    return trained_metrics(
        run.trainer, run.controller, run.session, cfg, saved_sae, (inputs.site, info.layer),
        model, held_out, device, planned, run.choice,
    )  # fmt: skip


def train_sae(
    activations: str | Path | list[str | Path],
    out_dir: str | Path,
    cfg: SAETrainConfig,
    model,
    checkpoint_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Train, save and evaluate one SAE (or transcoder: `activations` the MLP's input and
    output files); return the metrics written to ``metrics.json``.

    Resumes from the newest checkpoint in ``checkpoint_dir`` (default: ``{out_dir}.ckpt``).
    On SIGTERM, checkpoints at the next step and raises resumable.Interrupted.
    """
    out_dir = Path(out_dir)
    ckpt_root = Path(checkpoint_dir or out_dir.with_name(out_dir.name + ".ckpt"))
    inputs = Inputs.read(cfg, activations)
    device = resolve_device(cfg.device)
    info = inputs.info
    fp = capture_fingerprint(cfg, info)
    state, tensors = resume_state(ckpt_root, fp)
    cfg = plan(cfg, info, device, model, state)
    run = train(cfg, inputs, device, ckpt_root, fp, state, tensors)
    metrics = write_trained(
        out_dir, "capture", run.trainer, run.controller, cfg, device,
        lambda saved: summarise(run, saved, cfg, inputs, device, model),
    )  # fmt: skip
    shutil.rmtree(ckpt_root, ignore_errors=True)
    return metrics


def run(
    config: dict,
    activations: Path | str | list[Path | str],
    model_json: Path | str,
    out_dir: Path | str,
    checkpoint_dir: Path | str | None = None,
) -> dict[str, Any]:
    """The stage: `config` holds the sae section and the master seed and device."""
    from circuitflow.model.load import load_model

    cfg = SAETrainConfig.from_config(config)
    Inputs.read(cfg, activations)  # refuse unusable files before paying for the model
    model = load_model(
        Path(model_json).parent, resolve_device(cfg.device), config["model"]["dtype"]
    )
    return train_sae(activations, out_dir, cfg, model, checkpoint_dir)
