"""SAELens's trainer, extended with a PI-controlled sparsity coefficient, a per-step hook and
checkpoints of its whole state (weights, Adam, schedulers, firing statistics, RNG, data position).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.sae import TrainStepInput, TrainStepOutput
from sae_lens.training.sae_trainer import SAETrainer

from circuitflow import memory
from circuitflow.capture.files import ActivationFileInfo
from circuitflow.sae import architectures
from circuitflow.sae.checkpoint import optimizer_from_flat, optimizer_to_flat
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.data import ActivationStream
from circuitflow.sae.sparsity import SparsityController


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
        self.coefficient_name = architectures.get(
            self.sae.cfg.architecture()
        ).controlled_coefficient
        self.after_step = after_step
        # A step that runs out of memory is redone in micro-batches (memory.OOMBackoff).
        self.backoff = memory.OOMBackoff(
            self.cfg.train_batch_size_samples, str(self.cfg.device), stage="train_sae"
        )

    def _train_step(self, sae, sae_in: torch.Tensor) -> TrainStepOutput:
        """One optimiser step on the batch `sae_in`; after an out-of-memory error the batch is
        split into micro-batches of the halved size whose gradients are accumulated (each loss
        weighted by its share of the rows), so the step, the learning-rate schedule and the data
        order are those of the full batch. The losses are means over rows (MSE, TopK's
        auxiliary loss), so the accumulated gradient equals the full batch's up to float
        rounding; BatchTopK's threshold is taken over each micro-batch instead."""

        def attempt(size: int) -> TrainStepOutput:
            if size >= len(sae_in):
                return super(ControlledSAETrainer, self)._train_step(sae, sae_in)
            self.optimizer.zero_grad()  # whatever a failed try left
            return self._accumulated_step(sae, sae_in, size)

        return self.backoff.run(attempt)

    def _optimiser_step(self, sae) -> None:
        """The end of SAELens's step once the gradients are in: clip, Adam, schedules."""
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.lr_scheduler.step()
        for scheduler in self.coefficient_schedulers.values():
            scheduler.step()

    def _accumulated_step(self, sae, sae_in: torch.Tensor, size: int) -> TrainStepOutput:
        """SAELens's `_train_step` over micro-batches of `size` rows (see `_train_step`)."""
        sae.train()
        outs = []
        for start in range(0, len(sae_in), size):
            part = sae_in[start : start + size]
            with self.autocast_if_enabled:
                out = self.sae.training_forward_pass(
                    step_input=TrainStepInput(
                        sae_in=part,
                        dead_neuron_mask=self.dead_neurons,
                        coefficients=self.get_coefficients(),
                        n_training_steps=self.n_training_steps,
                        is_logging_step=self._is_logging_step(),
                    ),
                )
            (out.loss * (len(part) / len(sae_in))).backward()
            outs.append(out)
        with torch.no_grad():
            feature_acts = torch.cat([o.feature_acts for o in outs])
            firing = feature_acts.bool().float()
            did_fire = firing.sum(-2).bool()
            self.n_forward_passes_since_fired += 1
            self.n_forward_passes_since_fired[did_fire] = 0
            self.act_freq_scores += firing.sum(0)
            self.n_frac_active_samples += self.cfg.train_batch_size_samples
        self._optimiser_step(sae)
        weights = [len(o.sae_in) / len(sae_in) for o in outs]

        def mean(values: list[torch.Tensor]) -> torch.Tensor:
            return sum(w * v.detach() for w, v in zip(weights, values, strict=True))

        return TrainStepOutput(
            sae_in=sae_in,
            sae_out=torch.cat([o.sae_out.detach() for o in outs]),
            feature_acts=feature_acts,
            hidden_pre=torch.cat([o.hidden_pre.detach() for o in outs]),
            loss=mean([o.loss for o in outs]),
            losses={k: mean([o.losses[k] for o in outs]) for k in outs[0].losses},
        )

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
class RunClock:
    elapsed_before: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started


def trainer_tensors(trainer: ControlledSAETrainer) -> dict[str, torch.Tensor]:
    tensors = {f"sae.{k}": v for k, v in trainer.sae.state_dict().items()}
    opt_tensors, _ = optimizer_to_flat(trainer.optimizer.state_dict())
    tensors.update(opt_tensors)
    tensors["trainer.act_freq_scores"] = trainer.act_freq_scores
    tensors["trainer.n_forward_passes_since_fired"] = trainer.n_forward_passes_since_fired
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    return tensors


def trainer_state(
    trainer: ControlledSAETrainer, stream: ActivationStream, clock: RunClock, fp: str
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


def restore(
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


def dead_window_steps(cfg: SAETrainConfig) -> int:
    return max(1, math.ceil(cfg.dead_window_tokens / int(cfg.batch_size)))


def trainer_config(cfg: SAETrainConfig, info: ActivationFileInfo, device: str) -> SAETrainerConfig:
    """SAELens's trainer config for `cfg` (batch size resolved) on activations `info`."""
    batch = int(cfg.batch_size)
    total_steps = cfg.total_tokens // batch
    dead_window = dead_window_steps(cfg)
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
            cfg.jumprelu.dead_window_steps or dead_window
            if cfg.architecture == "jumprelu"
            else dead_window
        ),
        feature_sampling_window=max(1, total_steps),
        n_batches_for_norm_estimate=min(100, max(1, info.n_tokens // batch)),
    )
