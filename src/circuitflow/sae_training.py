"""Train one SAE on one layer's captured activations with SAELens, resumably.

``train_sae`` is the stage: it streams batches from the HDF5 file, trains with SAELens's
``SAETrainer`` (subclassed for sparsity control and checkpoints), saves the SAE in SAELens format
and measures it on the model. Checkpoints live outside the output directory, because Snakemake
deletes a ``directory()`` output before a retry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import resource
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from sae_lens import SAE
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
from sae_lens.saes.sae import SAEMetadata, TrainingSAE, TrainStepOutput  # noqa: I001
from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer
from transformer_lens import HookedTransformer

from circuitflow import memory
from circuitflow.io import write_json
from circuitflow.sae_checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    save_checkpoint,
)
from circuitflow.sae_data import (
    ActivationFileInfo,
    ActivationStream,
    ActivationStreamConfig,
    load_eval_contexts,
    read_activation_info,
)
from circuitflow.sae_metrics import evaluate_sae
from circuitflow.sparsity_control import (
    SparsityController,
    SparsityControllerConfig,
    plot_history,
)

log = logging.getLogger(__name__)

Architecture = Literal["topk", "batchtopk", "jumprelu", "standard"]
ARCHITECTURES: tuple[str, ...] = ("topk", "batchtopk", "jumprelu", "standard")
# Exit status for "checkpointed on SIGTERM, rerun me" (EX_TEMPFAIL from sysexits.h).
EXIT_INTERRUPTED = 75


class TrainingInterrupted(RuntimeError):
    """Training stopped on SIGTERM after writing a checkpoint; rerunning resumes it."""


class ConfigError(ValueError):
    """A bad ``sae:`` config value; the message names the key."""


@dataclass
class JumpReLUConfig:
    """JumpReLU training knobs (``sae.jumprelu``), passed to SAELens's JumpReLUTrainingSAEConfig.

    Defaults differ from SAELens's ("step" loss, no pre-activation loss) on purpose. With the
    "step" L0 loss the penalty only ever pushes thresholds up, and Adam moves a threshold by ~lr
    per step whatever the size of its gradient, so once L0 undershoots the target no reduction of
    the coefficient brings it back (measured on the embedded default: L0 4.6 for a target of 16,
    coefficient 50x below its start). The "quadratic" loss, ``2/target * (l0 - target)^2`` per
    token, pushes thresholds down below the target, and the PI controller then only trims its
    stiffness; the pre-activation loss revives latents whose threshold has drifted above every
    pre-activation (the straight-through gradient is zero there, so they cannot come back alone).
    """

    init_threshold: float = 0.01
    bandwidth: float = 0.05
    sparsity_loss_mode: Literal["step", "tanh", "quadratic"] = "quadratic"
    pre_act_loss_coefficient: float | None = 1e-3
    tanh_scale: float = 4.0
    ste_to_input: bool = False
    # Steps without firing before a latent counts as dead for the pre-activation loss;
    # null means the trainer's dead window (sae.dead_window_tokens / sae.batch_size).
    dead_window_steps: int | None = 20


@dataclass
class SAETrainConfig:
    """The ``sae:`` config block (schema: workflow/schemas, key ``sae``)."""

    architecture: Architecture = "topk"
    expansion_factor: int = 8
    d_sae: int | None = None
    k: int = 16
    target_l0: float = 16.0
    l1_coefficient: float = 0.05
    controller: SparsityControllerConfig = field(default_factory=SparsityControllerConfig)
    jumprelu: JumpReLUConfig = field(default_factory=JumpReLUConfig)
    lr: float = 4e-3
    lr_warm_up_steps: int = 10
    lr_decay_fraction: float = 0.2
    total_tokens: int = 1_000_000
    batch_size: int | Literal["auto"] = 1024  # auto: planned from the device's memory
    normalize_activations: Literal["none", "expected_average_only_in"] = "expected_average_only_in"
    shuffle_buffer_tokens: int = 262_144
    checkpoint_every_tokens: int = 250_000
    dead_window_tokens: int = 200_000
    eval_contexts: int = 64
    autocast: bool = False
    compile: bool = False
    device: str = "auto"
    seed: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SAETrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"sae: unknown key(s) {unknown}")
        d = dict(d)
        ctrl = d.pop("controller", None) or {}
        cnames = {f.name for f in dataclasses.fields(SparsityControllerConfig)}
        bad = sorted(set(ctrl) - cnames)
        if bad:
            raise ConfigError(f"sae.controller: unknown key(s) {bad}")
        jr = d.pop("jumprelu", None) or {}
        jnames = {f.name for f in dataclasses.fields(JumpReLUConfig)}
        bad = sorted(set(jr) - jnames)
        if bad:
            raise ConfigError(f"sae.jumprelu: unknown key(s) {bad}")
        cfg = cls(**d, controller=SparsityControllerConfig(**ctrl), jumprelu=JumpReLUConfig(**jr))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"sae.architecture: {self.architecture!r} not in {ARCHITECTURES}")
        positive = (
            "expansion_factor",
            "k",
            "target_l0",
            "lr",
            "total_tokens",
            "batch_size",
            "checkpoint_every_tokens",
            "dead_window_tokens",
            "eval_contexts",
        )
        if self.batch_size != "auto" and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
        ):
            raise ConfigError(
                f"sae.batch_size: must be a positive integer or 'auto', got {self.batch_size!r}"
            )
        for key in positive:
            if key == "batch_size" and self.batch_size == "auto":
                continue
            if not getattr(self, key) > 0:
                raise ConfigError(f"sae.{key}: must be positive, got {getattr(self, key)!r}")
        if self.batch_size != "auto" and self.total_tokens < self.batch_size:
            raise ConfigError("sae.total_tokens: must be at least sae.batch_size")
        if not 0 <= self.lr_decay_fraction < 1:
            raise ConfigError("sae.lr_decay_fraction: must be in [0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def build_training_sae(
    cfg: SAETrainConfig, d_in: int, hook_name: str, device: str
) -> TrainingSAE[Any]:
    """Construct the SAELens training SAE named by ``cfg.architecture``."""
    d_sae = cfg.d_sae or cfg.expansion_factor * d_in
    common: dict[str, Any] = {
        "d_in": d_in,
        "d_sae": d_sae,
        "device": device,
        "normalize_activations": cfg.normalize_activations,
        # Without hook_name, HookedSAETransformer.add_sae silently skips the SAE.
        "metadata": SAEMetadata(hook_name=hook_name),
    }
    if cfg.architecture == "topk":
        return TopKTrainingSAE(TopKTrainingSAEConfig(k=cfg.k, **common))
    if cfg.architecture == "batchtopk":
        return BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(k=cfg.k, **common))
    if cfg.architecture == "jumprelu":
        jr = cfg.jumprelu
        return JumpReLUTrainingSAE(
            JumpReLUTrainingSAEConfig(
                l0_coefficient=cfg.l1_coefficient,
                jumprelu_init_threshold=jr.init_threshold,
                jumprelu_bandwidth=jr.bandwidth,
                jumprelu_sparsity_loss_mode=jr.sparsity_loss_mode,
                pre_act_loss_coefficient=jr.pre_act_loss_coefficient,
                jumprelu_tanh_scale=jr.tanh_scale,
                jumprelu_ste_to_input=jr.ste_to_input,
                target_l0=cfg.target_l0 if jr.sparsity_loss_mode == "quadratic" else None,
                **common,
            )
        )
    return StandardTrainingSAE(
        StandardTrainingSAEConfig(l1_coefficient=cfg.l1_coefficient, **common)
    )


def controlled_coefficient(architecture: str) -> str | None:
    """SAELens's name for the sparsity coefficient, or None where k fixes sparsity."""
    return {"standard": "l1", "jumprelu": "l0"}.get(architecture)


class ControlledSAETrainer(SAETrainer):
    """SAETrainer with a PI-controlled sparsity coefficient and a per-step hook.

    SAELens shortfall: its coefficients come from ``CoefficientScheduler``, a fixed linear warm-up
    to a constant, and neither ``fit()`` nor the scheduler accepts a feedback signal. The trainer
    does route every coefficient through ``get_coefficients()`` and every batch through the public
    ``step()`` seam, so overriding those two is enough; the loop itself stays SAELens's.
    """

    def __init__(
        self,
        *args: Any,
        controller: SparsityController | None = None,
        after_step: Callable[[ControlledSAETrainer], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.controller = controller
        self.coefficient_name = controlled_coefficient(self.sae.cfg.architecture())
        self.after_step = after_step

    @torch.no_grad()
    def get_coefficients(self) -> dict[str, float]:
        coeffs = super().get_coefficients()
        if self.controller is not None and self.coefficient_name is not None:
            coeffs[self.coefficient_name] = self.controller.coefficient
        return coeffs

    def step(self, batch: torch.Tensor) -> TrainStepOutput:
        out = super().step(batch)
        if self.controller is not None:
            l0 = (out.feature_acts != 0).sum(-1).float().mean().item()
            self.controller.observe(self.n_training_steps, l0)
        if self.after_step is not None:
            # fit() increments n_training_steps after step(); the hook sees the pre-step count.
            self.after_step(self)
        return out


@dataclass
class _RunClock:
    elapsed_before: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started


def _fingerprint(cfg: SAETrainConfig, info: ActivationFileInfo) -> str:
    # Eval and checkpoint cadence do not change the trained weights, so they may change on resume.
    relevant = {
        k: v
        for k, v in cfg.to_dict().items()
        if k not in ("checkpoint_every_tokens", "eval_contexts", "device")
    }
    blob = json.dumps(
        [relevant, info.model_hash, info.token_set_hash, info.hook_name, info.n_tokens],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _trainer_tensors(trainer: ControlledSAETrainer) -> dict[str, torch.Tensor]:
    tensors = {f"sae.{k}": v for k, v in trainer.sae.state_dict().items()}
    opt_tensors, _ = optimizer_to_flat(trainer.optimizer.state_dict())
    tensors.update(opt_tensors)
    tensors["trainer.act_freq_scores"] = trainer.act_freq_scores
    tensors["trainer.n_forward_passes_since_fired"] = trainer.n_forward_passes_since_fired
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    return tensors


def _trainer_state(
    trainer: ControlledSAETrainer, stream: ActivationStream, clock: _RunClock, fp: str
) -> dict[str, Any]:
    _, opt_json = optimizer_to_flat(trainer.optimizer.state_dict())
    return {
        "fingerprint": fp,
        # Saved from inside step(), before fit() increments the step counter.
        "n_training_steps": trainer.n_training_steps + 1,
        "n_training_samples": trainer.n_training_samples,
        "n_frac_active_samples": trainer.n_frac_active_samples,
        "started_fine_tuning": trainer.started_fine_tuning,
        "optimizer": opt_json,
        "lr_scheduler": trainer.lr_scheduler.state_dict(),
        "coefficient_schedulers": {
            k: s.state_dict() for k, s in trainer.coefficient_schedulers.items()
        },
        "scaling_factor": trainer.activation_scaler.scaling_factor,
        "controller": trainer.controller.state_dict() if trainer.controller else None,
        "data_position": stream.position,
        "batch_size": int(trainer.cfg.train_batch_size_samples),
        "wall_time_s": clock.elapsed(),
    }


def _restore(
    trainer: ControlledSAETrainer, tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> None:
    dev = trainer.cfg.device
    trainer.sae.load_state_dict(
        {k[4:]: v for k, v in tensors.items() if k.startswith("sae.")}, strict=True
    )
    trainer.optimizer.load_state_dict(
        optimizer_from_flat({k: v.to(dev) for k, v in tensors.items()}, state["optimizer"])
    )
    trainer.lr_scheduler.load_state_dict(state["lr_scheduler"])
    for k, s in state["coefficient_schedulers"].items():
        trainer.coefficient_schedulers[k].load_state_dict(s)
    trainer.n_training_steps = state["n_training_steps"]
    trainer.n_training_samples = state["n_training_samples"]
    trainer.n_frac_active_samples = state["n_frac_active_samples"]
    trainer.started_fine_tuning = state["started_fine_tuning"]
    trainer.act_freq_scores = tensors["trainer.act_freq_scores"].to(dev)
    trainer.n_forward_passes_since_fired = tensors["trainer.n_forward_passes_since_fired"].to(dev)
    trainer.activation_scaler.scaling_factor = state["scaling_factor"]
    if trainer.controller is not None and state["controller"] is not None:
        trainer.controller.load_state_dict(state["controller"])
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])


def _peak_memory_mb(device: str) -> float:
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    # ru_maxrss is KiB on Linux: the whole process, model and data included.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _param_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _dead_window_steps(cfg: SAETrainConfig) -> int:
    return max(1, math.ceil(cfg.dead_window_tokens / int(cfg.batch_size)))


def trainer_config(cfg: SAETrainConfig, info: ActivationFileInfo, device: str) -> SAETrainerConfig:
    """SAELens's trainer config for `cfg` (batch size resolved) on activations `info`."""
    batch = int(cfg.batch_size)
    total_steps = cfg.total_tokens // batch
    dead_window_steps = _dead_window_steps(cfg)
    return SAETrainerConfig(
        total_training_samples=total_steps * batch,
        train_batch_size_samples=batch,
        lr=cfg.lr,
        # Constant schedule: lr_end is unused by SAELens there, but it must be given explicitly.
        lr_end=cfg.lr,
        lr_scheduler_name="constant",
        lr_warm_up_steps=min(cfg.lr_warm_up_steps, total_steps // 2),
        lr_decay_steps=int(total_steps * cfg.lr_decay_fraction),
        device=device,
        autocast=cfg.autocast,
        dead_feature_window=(
            cfg.jumprelu.dead_window_steps or dead_window_steps
            if cfg.architecture == "jumprelu"
            else dead_window_steps
        ),
        feature_sampling_window=max(1, total_steps),
        n_batches_for_norm_estimate=min(100, max(1, info.n_tokens // batch)),
    )


def memory_estimate(
    cfg: SAETrainConfig, info: ActivationFileInfo, device: str, resident: int = 0
) -> memory.Estimate:
    """The memory planner's estimate of this training run per batch row; `resident` is what
    already sits on the device for the run (the model, kept for the spliced evaluation)."""
    return memory.estimate_sae_training(
        info.d_in,
        cfg.d_sae or cfg.expansion_factor * info.d_in,
        cfg.architecture,
        device,
        n_file_rows=info.n_tokens,
        shuffle_buffer_rows=cfg.shuffle_buffer_tokens,
        chunk_rows=info.chunk_rows,
        resident=resident,
    )


def plan_batch_size(
    cfg: SAETrainConfig, info: ActivationFileInfo, device: str, model: Any = None
) -> memory.BatchPlan:
    """`sae.batch_size: auto`: the largest power of two up to memory.SAE_AUTO_MAX_BATCH (and
    total_tokens) whose estimated peak fits in 80% of the device's memory."""
    resident = _param_bytes(model) if model is not None else 0
    plan = memory.plan_batch_size(
        memory_estimate(cfg, info, device, resident),
        min(memory.SAE_AUTO_MAX_BATCH, cfg.total_tokens),
        available=memory.available_bytes(device) + resident,  # the model is loaded already
    )
    log.info("sae.batch_size auto: %s", plan.describe())
    return plan


def train_sae(
    activations: str | Path,
    out_dir: str | Path,
    cfg: SAETrainConfig,
    model: HookedTransformer,
    checkpoint_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Train, save and evaluate one SAE; return the metrics written to ``metrics.json``.

    Resumes from the newest checkpoint in ``checkpoint_dir`` (default: ``{out_dir}.ckpt``).
    On SIGTERM, checkpoints at the next step and raises TrainingInterrupted.
    """
    out_dir = Path(out_dir)
    ckpt_root = (
        Path(checkpoint_dir) if checkpoint_dir else out_dir.with_name(out_dir.name + ".ckpt")
    )
    info = read_activation_info(activations)
    device = resolve_device(cfg.device)
    fp = _fingerprint(cfg, info)

    ckpt = latest_checkpoint(ckpt_root)
    state: dict[str, Any] | None = None
    tensors: dict[str, torch.Tensor] = {}
    if ckpt is not None:
        tensors, state = load_checkpoint(ckpt)  # CheckpointError if damaged
        if state.get("fingerprint") != fp:
            log.warning("%s: checkpoint is for another config or input; starting over", ckpt)
            shutil.rmtree(ckpt_root)
            state, tensors = None, {}
    if cfg.batch_size == "auto":
        # A resumed run keeps the batch size it started with, whatever this device fits.
        saved = (state or {}).get("batch_size")
        batch = saved or plan_batch_size(cfg, info, device, model).batch_size
        cfg = dataclasses.replace(cfg, batch_size=int(batch))

    torch.manual_seed(cfg.seed)
    sae = build_training_sae(cfg, info.d_in, info.hook_name, device)
    if cfg.compile:
        # Compiles the per-step forward/loss; parameter names (and so checkpoints) are unchanged.
        sae.training_forward_pass = torch.compile(sae.training_forward_pass)  # type: ignore[method-assign]
    trainer_cfg = trainer_config(cfg, info, device)
    coef_name = controlled_coefficient(cfg.architecture)
    controller = (
        SparsityController(cfg.target_l0, cfg.l1_coefficient, cfg.controller) if coef_name else None
    )

    clock = _RunClock()
    stop_requested = {"flag": False}

    stream = ActivationStream(
        info,
        ActivationStreamConfig(
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            shuffle_buffer_tokens=cfg.shuffle_buffer_tokens,
            device=device,
        ),
        position=state["data_position"] if state else 0,
    )
    last_ckpt_tokens = state["n_training_samples"] if state else 0

    def after_step(tr: ControlledSAETrainer) -> None:
        nonlocal last_ckpt_tokens
        done = tr.n_training_samples >= trainer_cfg.total_training_samples
        due = tr.n_training_samples - last_ckpt_tokens >= cfg.checkpoint_every_tokens
        if stop_requested["flag"] or (due and not done):
            save_checkpoint(
                ckpt_root,
                tr.n_training_steps + 1,
                _trainer_tensors(tr),
                _trainer_state(tr, stream, clock, fp),
            )
            last_ckpt_tokens = tr.n_training_samples
            if stop_requested["flag"]:
                raise TrainingInterrupted(
                    f"SIGTERM: checkpointed at {tr.n_training_samples} tokens in {ckpt_root}"
                )

    trainer = ControlledSAETrainer(
        cfg=trainer_cfg,
        sae=sae,
        data_provider=stream,
        controller=controller,
        after_step=after_step,
    )
    if state is not None:
        _restore(trainer, tensors, state)
        clock.elapsed_before = state["wall_time_s"]
        log.info("resumed from %s at %d tokens", ckpt, trainer.n_training_samples)
    tokens_at_start = trainer.n_training_samples

    def on_sigterm(signum: int, frame: object) -> None:
        stop_requested["flag"] = True

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    session_start = time.perf_counter()
    try:
        trainer.fit()
    finally:
        signal.signal(signal.SIGTERM, previous)
        stream.close()
    session_s = time.perf_counter() - session_start
    wall = clock.elapsed()

    steps_done = trainer.n_training_steps
    dead_window_steps = _dead_window_steps(cfg)
    since_fired = trainer.n_forward_passes_since_fired
    dead_fraction = (since_fired >= min(dead_window_steps, steps_done)).float().mean().item()

    # Save, reload from disk and evaluate the artifact exactly as downstream stages will see it.
    tmp = out_dir.with_name(f".{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.sae.save_inference_model(tmp)
    saved = SAE.load_from_disk(tmp, device=device)
    contexts = load_eval_contexts(info, cfg.eval_contexts)
    quality = evaluate_sae(
        model, saved, contexts, exclude_bos=info.bos_excluded, bos_token_id=info.bos_token_id
    )
    history = controller.state.history if controller else []
    metrics: dict[str, Any] = {
        **quality,
        "dead_fraction": dead_fraction,
        "tokens_trained": trainer.n_training_samples,
        "wall_time_s": wall,
        "tokens_per_s": (trainer.n_training_samples - tokens_at_start) / session_s,
        "peak_memory_mb": _peak_memory_mb(device),
        # The planner's estimate of the training loop's peak (model, SAE, optimiser, batch).
        "planned_memory_mb": memory_estimate(cfg, info, device, _param_bytes(model)).total(
            int(cfg.batch_size)
        )
        / memory.MiB,
        "architecture": cfg.architecture,
        "d_in": info.d_in,
        "d_sae": saved.cfg.d_sae,
        "hook_name": info.hook_name,
        "layer": info.layer,
        "site": info.site,
        "device": device,
        "resumed": tokens_at_start > 0,
        "sparsity_coefficient": coef_name,
        "controller_history": [
            {"step": int(s), "l0": l0, "coefficient": c} for s, l0, c in history
        ],
        "config": cfg.to_dict(),
    }
    write_json(tmp / "metrics.json", metrics)
    if history:
        plot_history(history, cfg.target_l0, coef_name or "", tmp / "sparsity_control.png")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    shutil.rmtree(ckpt_root, ignore_errors=True)
    return metrics


__all__ = [
    "EXIT_INTERRUPTED",
    "CheckpointError",
    "ConfigError",
    "ControlledSAETrainer",
    "SAETrainConfig",
    "TrainingInterrupted",
    "build_training_sae",
    "train_sae",
]
