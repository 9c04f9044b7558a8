"""The GPU trainer's members (`sae.trainer: gpu`): each dictionary of a sae.stacked.Stack keeps a
trainer of its own, SAELens's trainer as ControlledSAETrainer (its SAE, activation scaler,
step counters, checkpoint state, SIGTERM hook), whose step is the stack's.

SAELens's loops step the members one after another (SAETrainer.fit a single one,
MultiSAETrainer.fit a streaming job's in turn); each member hands its scaled batch to the
stack, and the last one's hand-in runs the step for all of them. A member's step output is
read from that step (`MemberOutput`), so it is complete once every member has stepped, which
is when the loops read it. The members' state lives in the stack (their parameters are views
of its stacked tensors, their Adam state and firing statistics slices of its own), and each
member reads and writes its slice in the formats a one-SAE trainer uses: checkpoints, resume
and the saved dictionaries are those of sae.trainer's functions, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from circuitflow.sae.stacked import Stack
from circuitflow.sae.trainer import ControlledSAETrainer


class MemberOptimizer:
    """Member i's view of the stack's Adam, with torch's optimizer state-dict interface (what
    sae.trainer's checkpoints save and restore)."""

    def __init__(self, stack: Stack, index: int):
        self.stack, self.index = stack, index

    @property
    def param_groups(self) -> list[dict]:
        return self.stack.optimizer.param_groups

    def state_dict(self) -> dict:
        return self.stack.member_optimizer_state(self.index)

    def load_state_dict(self, state: dict) -> None:
        self.stack.load_member_optimizer_state(self.index, state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients live only inside the stack's step."""


class MemberOutput:
    """Member i's TrainStepOutput of the stack's step `step`: read from it once it has run."""

    def __init__(self, stack: Stack, index: int, step: int, sae_in: torch.Tensor):
        self.stack, self.index, self.step = stack, index, step
        self.sae_in = sae_in[:, stack.d_in :] if stack.transcoder else sae_in
        self.metrics: dict[str, Any] = {}

    def _result(self):
        if self.stack.steps <= self.step:
            raise RuntimeError("a stack member's step output is read before every member stepped")
        return self.stack.result

    @property
    def sae_out(self) -> torch.Tensor:
        return self._result().sae_out[self.index]

    def _sparse(self, values: torch.Tensor) -> torch.Tensor:
        r = self._result()
        entries = torch.stack([r.tokens[self.index], r.latents[self.index]])
        shape = (len(self.sae_in), self.stack.saes[self.index].cfg.d_sae)
        return torch.sparse_coo_tensor(entries, values[self.index], shape, check_invariants=False)

    @property
    def feature_acts(self) -> torch.Tensor:
        """SAELens's dense [batch, d_sae] activations, as a sparse tensor."""
        return self._sparse(self._result().acts)

    @property
    def hidden_pre(self) -> torch.Tensor:
        return self._sparse(self._result().scores)

    @property
    def losses(self) -> dict[str, torch.Tensor]:
        r = self._result()
        return {"mse_loss": r.mse[self.index], "auxiliary_reconstruction_loss": r.aux[self.index]}

    @property
    def loss(self) -> torch.Tensor:
        r = self._result()
        return r.mse[self.index] + r.aux[self.index]


class StackedTrainer(ControlledSAETrainer):
    """One member of a Stack, as SAELens's trainer: SAETrainer's loop and seams, with the
    stack's step, optimiser and statistics (see the module's doc)."""

    def __init__(self, *args: Any, stack: Stack, index: int, **kwargs: Any) -> None:
        self.stack, self.index = stack, index  # before SAETrainer sets the statistics below
        super().__init__(*args, **kwargs)
        self.optimizer = MemberOptimizer(stack, index)
        self.lr_scheduler = stack.lr_scheduler

    @property
    def act_freq_scores(self) -> torch.Tensor:
        return self.stack.act_freq[self.index]

    @act_freq_scores.setter
    def act_freq_scores(self, value: torch.Tensor) -> None:
        self.stack.act_freq[self.index].copy_(value)

    @property
    def n_forward_passes_since_fired(self) -> torch.Tensor:
        return self.stack.since_fired[self.index]

    @n_forward_passes_since_fired.setter
    def n_forward_passes_since_fired(self, value: torch.Tensor) -> None:
        """Set at the start and on resume: the stack's lagged reading starts from it."""
        self.stack.since_fired[self.index].copy_(value)
        self.stack.restored()

    def _train_step(self, sae: Any, sae_in: torch.Tensor) -> MemberOutput:  # type: ignore[override]
        sae.train()
        self.n_frac_active_samples += self.cfg.train_batch_size_samples
        step = self.stack.steps
        if self.stack.submit(self.index, sae_in):
            self.stack.run(self.backoff)
        return MemberOutput(self.stack, self.index, step, sae_in)

    @torch.no_grad()
    def _update_pbar(self, step_output: Any, pbar: Any, update_interval: int = 100) -> None:
        """SAETrainer's progress bar, with the losses of the newest step whose copy to the host
        has landed (SAELens's reads the current step's: a synchronisation)."""
        if self.n_training_steps % update_interval == 0:
            pbar.set_description(self.stack.loss_description(self.index))
            pbar.update(update_interval * self.cfg.train_batch_size_samples)
