"""Building the trainer `sae.trainer` names (sae.trainer_choice picks it under `auto`):

- `fast` (sae.fast): sparse products in CSR layout, made for CPUs;
- `gpu` (sae.stacked): fixed shapes, dense bf16 products, no host synchronisation, a streaming
  job's dictionaries of one shape stepped as one; made for GPUs, runs anywhere;
- `saelens`: SAELens's own trainer (ControlledSAETrainer), the only one for jumprelu and
  standard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from sae_lens.config import SAETrainerConfig

from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.fast import SparseTopKTrainer
from circuitflow.sae.sparsity import SparsityController
from circuitflow.sae.stacked import Stack, StepSpec
from circuitflow.sae.stacked_trainer import StackedTrainer
from circuitflow.sae.trainer import ControlledSAETrainer
from circuitflow.sae.trainer_choice import Choice, choose
from circuitflow.sae.transcoder import is_transcoder


def build_trainer(
    cfg: SAETrainConfig,
    trainer_cfg: SAETrainerConfig,
    sae: Any,
    data_provider: Iterator[torch.Tensor],
    controller: SparsityController | None = None,
    after_step: Callable[[ControlledSAETrainer], None] | None = None,
    choice: Choice | None = None,
) -> ControlledSAETrainer:
    """One dictionary's trainer, the one `choice` names (default: `choose` on the trainer
    config's device); SAELens's is compiled if `sae.compile` asks (the others have nothing
    compile speeds up: sae.fast's dense part is one matmul, one multiply-add and topk, measured
    equal on CPU; the gpu step's are matmuls and topk)."""
    choice = choice or choose(cfg, str(trainer_cfg.device))
    return build_group(cfg, trainer_cfg, [sae], [controller], choice, after_step, data_provider)[0]


def build_group(
    cfg: SAETrainConfig,
    trainer_cfg: SAETrainerConfig,
    saes: Sequence[Any],
    controllers: Sequence[SparsityController | None],
    choice: Choice,
    after_step: Callable[[ControlledSAETrainer], None] | None = None,
    data_provider: Iterator[torch.Tensor] | None = None,
) -> list[ControlledSAETrainer]:
    """A trainer for each of `saes` (a streaming job's, which SAELens's loop steps in turn,
    the batches its own: `data_provider` only for a trainer that iterates itself); with the gpu
    trainer, those of one shape and kind share one Stack and step as one."""
    provider = iter(()) if data_provider is None else data_provider
    common = {"cfg": trainer_cfg, "data_provider": provider, "after_step": after_step}
    trainers: list[ControlledSAETrainer | None] = [None] * len(saes)
    if choice.trainer == "gpu":
        for members in _stackable(saes, cfg.autocast):
            stack = Stack([saes[i] for i in members], trainer_cfg, cfg.autocast)
            for j, i in enumerate(members):
                trainers[i] = StackedTrainer(sae=saes[i], controller=controllers[i],
                                             stack=stack, index=j, **common)  # fmt: skip
        return trainers
    cls = SparseTopKTrainer if choice.trainer == "fast" else ControlledSAETrainer
    for i, sae in enumerate(saes):
        if choice.trainer == "saelens" and cfg.compile:
            # Compiles the per-step forward/loss; parameter names (and checkpoints) unchanged.
            sae.training_forward_pass = torch.compile(sae.training_forward_pass)
        trainers[i] = cls(sae=sae, controller=controllers[i], **common)
    return trainers


def _stackable(saes: Sequence[Any], autocast: bool) -> list[list[int]]:
    """Indices of `saes` grouped by what a Stack needs in common (shapes, kind, step)."""
    groups: dict[Any, list[int]] = {}
    for i, sae in enumerate(saes):
        key = (tuple(sae.W_enc.shape), tuple(sae.W_dec.shape), is_transcoder(sae),
               StepSpec.of(sae, autocast))  # fmt: skip
        groups.setdefault(key, []).append(i)
    return list(groups.values())
