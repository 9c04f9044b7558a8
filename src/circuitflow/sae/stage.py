"""The train_sae stage: train one SAE on one layer's captured activations, resumably.

Steps: `resume_state` (the newest checkpoint, if it was made for this config and input), `plan`
(the batch size, from memory when `sae.batch_size: auto`), `train` (SAELens's trainer, or for
TopK and BatchTopK its sparse variant in sae.fast, streaming batches from the HDF5 file,
checkpointing every `checkpoint_every_tokens` and on SIGTERM), `summarise` (the saved SAE
reloaded from disk and measured on the model) and `write` (the SAE in SAELens's format and
metrics.json, replacing the output directory atomically). Checkpoints live outside the output
directory, because Snakemake deletes a `directory()` output before a retry.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitflow import memory
from circuitflow.capture.files import ActivationFileInfo, read_activation_info
from circuitflow.devices import resolve_device
from circuitflow.errors import CheckpointError, ConfigError
from circuitflow.io import atomic_dir, write_json
from circuitflow.perf import PassCounter
from circuitflow.resumable import Interrupted, sigterm_flag
from circuitflow.sae import architectures
from circuitflow.sae import plan as sae_plan
from circuitflow.sae.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    set_aside,
)
from circuitflow.sae.config import HOOKS_READ, SAETrainConfig
from circuitflow.sae.data import ActivationStream, ActivationStreamConfig, load_eval_contexts
from circuitflow.sae.fast import build_trainer
from circuitflow.sae.metrics import evaluate_dictionary
from circuitflow.sae.sparsity import SparsityController, plot_history
from circuitflow.sae.trainer import (
    ControlledSAETrainer,
    RunClock,
    dead_window_steps,
    fingerprint,
    restore,
    trainer_config,
    trainer_state,
    trainer_tensors,
)
from circuitflow.sae.transcoder import PairedActivationStream, check_pair, save_dictionary

log = logging.getLogger(__name__)


def param_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


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
        sparse=cfg.uses_fast_trainer(),
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


def resume_state(ckpt_root: Path, fp: str) -> tuple[dict | None, dict[str, torch.Tensor]]:
    """(state, tensors) of the newest sound checkpoint under `ckpt_root` made for fingerprint
    `fp`; (None, {}) when there is none, or when it was made for another config or input
    (deleted). A damaged checkpoint (truncated by a full disk, bit rot) is set aside with a
    warning and the one before it is tried: a retry never fails on it again (no crash loop on
    Slurm retries), and with none left training starts over."""
    while (ckpt := latest_checkpoint(ckpt_root)) is not None:
        try:
            tensors, state = load_checkpoint(ckpt)
        except CheckpointError as err:
            aside = set_aside(ckpt)
            log.warning("%s; set aside as %s, trying the previous checkpoint", err, aside)
            continue
        if state.get("fingerprint") != fp:
            log.warning("%s: checkpoint is for another config or input; starting over", ckpt)
            shutil.rmtree(ckpt_root)
            return None, {}
        log.info("resumed from %s at %d tokens", ckpt, state["n_training_samples"])
        return state, tensors
    return None, {}


def plan(
    cfg: SAETrainConfig, info: ActivationFileInfo, device: str, model: Any, state: dict | None
) -> SAETrainConfig:
    """`cfg` with the batch size settled: a resumed run keeps the size it started with, whatever
    this device fits; `auto` is planned from memory."""
    if cfg.batch_size != "auto":
        return cfg
    batch = (state or {}).get("batch_size") or plan_auto_batch(cfg, info, device, model).batch_size
    return dataclasses.replace(cfg, batch_size=int(batch))


# --- inputs ---------------------------------------------------------------------------------------
@dataclass
class Inputs:
    """The activation files a dictionary trains on: its site's (an SAE), or the MLP's input and
    output at one layer (a transcoder, `target` the output's)."""

    info: ActivationFileInfo
    target: ActivationFileInfo | None = None

    @classmethod
    def read(cls, cfg: SAETrainConfig, activations) -> Inputs:
        paths = [activations] if isinstance(activations, str | Path) else list(activations)
        want = HOOKS_READ[cfg.kind]
        if len(paths) != want:
            what = "the MLP's input and output files" if want == 2 else "one activation file"
            raise ConfigError(f"--activations: sae.kind {cfg.kind} trains on {what}, got {paths}")
        infos = [read_activation_info(p) for p in paths]
        if want == 2:
            check_pair(*infos)
        return cls(*infos)

    def stream(self, cfg: ActivationStreamConfig, position: int):
        if self.target is None:
            return ActivationStream(self.info, cfg, position)
        return PairedActivationStream(self.info, self.target, cfg, position)

    @property
    def site(self) -> str:
        """Where the dictionary is spliced: the site it reconstructs or predicts."""
        return (self.target or self.info).site


# --- train ----------------------------------------------------------------------------------------
@dataclass
class Trained:
    trainer: ControlledSAETrainer
    controller: SparsityController | None
    tokens_at_start: int  # tokens trained before this session (a resumed run)
    session_s: float  # wall time of this session's training loop
    clock: RunClock  # wall time over every session


def train(
    cfg: SAETrainConfig,
    inputs: Inputs,
    device: str,
    ckpt_root: Path,
    fp: str,
    state: dict | None,
    tensors: dict[str, torch.Tensor],
) -> Trained:
    """Train to `cfg.total_tokens`, from the checkpoint `state` when given. Checkpoints every
    `checkpoint_every_tokens`; on SIGTERM checkpoints at the next step and raises Interrupted."""
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
    clock = RunClock()
    stream = inputs.stream(
        ActivationStreamConfig(
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            shuffle_buffer_tokens=cfg.shuffle_buffer_tokens,
            device=device,
        ),
        state["data_position"] if state else 0,
    )
    last_ckpt = state["n_training_samples"] if state else 0

    with sigterm_flag() as stop:

        def after_step(tr: ControlledSAETrainer) -> None:
            nonlocal last_ckpt
            done = tr.n_training_samples >= trainer_cfg.total_training_samples
            due = tr.n_training_samples - last_ckpt >= cfg.checkpoint_every_tokens
            if stop.requested or (due and not done):
                save_checkpoint(
                    ckpt_root,
                    tr.n_training_steps + 1,
                    trainer_tensors(tr),
                    trainer_state(tr, stream, clock, fp),
                )
                last_ckpt = tr.n_training_samples
                if stop.requested:
                    raise Interrupted(
                        f"SIGTERM: checkpointed at {tr.n_training_samples} tokens in {ckpt_root}"
                    )

        trainer = build_trainer(cfg, trainer_cfg, sae, stream, controller, after_step)
        if state is not None:
            restore(trainer, tensors, state)
            clock.elapsed_before = state["wall_time_s"]
        tokens_at_start = trainer.n_training_samples
        if torch.device(device).type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            trainer.fit()
        finally:
            stream.close()
    return Trained(trainer, controller, tokens_at_start, time.perf_counter() - t0, clock)


# --- summarise and write --------------------------------------------------------------------------
def summarise(
    run: Trained, saved_sae, cfg: SAETrainConfig, inputs: Inputs, device: str, model
) -> dict[str, Any]:
    """metrics.json: the saved SAE measured on the model, and how training went. A transcoder:
    the explained variance of the MLP's output, and the losses with its MLP replaced by it."""
    info = inputs.info
    tr = run.trainer
    since_fired = tr.n_forward_passes_since_fired
    window = min(dead_window_steps(cfg), tr.n_training_steps)
    contexts = load_eval_contexts(info, cfg.eval_contexts)
    counter = PassCounter()  # the evaluation's model passes (training steps are tokens_trained)
    quality = evaluate_dictionary(
        model,
        saved_sae,
        info.layer,
        contexts,
        exclude_bos=info.bos_excluded,
        bos_token_id=info.bos_token_id,
        counter=counter,
    )
    history = run.controller.state.history if run.controller else []
    resident = param_bytes(model)
    return {
        **quality,
        "dead_fraction": (since_fired >= window).float().mean().item(),
        "tokens_trained": tr.n_training_samples,
        "wall_time_s": run.clock.elapsed(),
        "tokens_per_s": (tr.n_training_samples - run.tokens_at_start) / run.session_s,
        "peak_memory_mb": memory.peak_memory_bytes(device) / memory.MiB,
        # The planner's estimate of the training loop's peak (model, SAE, optimiser, batch); on
        # CPU, where peak_memory_mb is the process's resident peak, with the libraries too.
        "planned_memory_mb": (
            memory_estimate(cfg, info, device, resident).total(int(cfg.batch_size))
            + (0 if device.startswith("cuda") else memory.runtime_bytes("model"))
        )
        / memory.MiB,
        "kind": cfg.kind,
        "architecture": cfg.architecture,
        "d_in": info.d_in,
        "d_sae": saved_sae.cfg.d_sae,
        "hook_name": info.hook_name,
        **({"hook_name_out": inputs.target.hook_name} if inputs.target else {}),
        "layer": info.layer,
        "site": inputs.site,
        "device": device,
        "resumed": run.tokens_at_start > 0,
        "sparsity_coefficient": architectures.get(cfg.architecture).controlled_coefficient,
        "controller_history": [
            {"step": int(s), "l0": l0, "coefficient": c} for s, l0, c in history
        ],
        "config": cfg.to_dict(),
        **counter.summary(len(contexts), unit="evaluation context"),
    }


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
    from sae_lens import SAE

    out_dir = Path(out_dir)
    ckpt_root = Path(checkpoint_dir or out_dir.with_name(out_dir.name + ".ckpt"))
    inputs = Inputs.read(cfg, activations)
    device = resolve_device(cfg.device)
    fp = fingerprint(cfg, inputs.info)
    state, tensors = resume_state(ckpt_root, fp)
    cfg = plan(cfg, inputs.info, device, model, state)
    run = train(cfg, inputs, device, ckpt_root, fp, state, tensors)
    # Save, reload from disk and evaluate the artifact exactly as downstream stages will see it.
    with atomic_dir(out_dir) as tmp:
        save_dictionary(run.trainer.sae, tmp)
        saved = SAE.load_from_disk(tmp, device=device)
        metrics = summarise(run, saved, cfg, inputs, device, model)
        write_json(tmp / "metrics.json", metrics)
        if metrics["controller_history"]:
            history = run.controller.state.history
            plot_history(
                history,
                cfg.target_l0,
                metrics["sparsity_coefficient"],
                tmp / "sparsity_control.png",
            )
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
