"""Which trainer trains a dictionary (`sae.trainer`), and building it.

- `fast` (sae.fast): sparse products in CSR layout, made for CPUs;
- `gpu` (sae.stacked): fixed shapes, dense bf16 products, no host synchronisation, a streaming
  job's dictionaries of one shape stepped as one; made for GPUs, runs anywhere;
- `saelens`: SAELens's own trainer (ControlledSAETrainer), the only one for jumprelu and
  standard.

`auto` picks, among the trainers that can train the architecture, the one measured fastest on
this kind of device: the committed results of benchmarks/sae_train.py at GPT-2 small's size
(`benchmarks/results/sae_train-*.json`, headline size gpt2: `make bench-gpu` on a GPU, the CPU
command in the script's doc), each trainer's tokens/s side by side on the same tokens. A GPU
with no result of its own takes the newest result of another CUDA GPU; a device type with none
(e.g. mps) gets SAELens's trainer, the reference. The same repository on the same kind of device
therefore always picks the same trainer, and `Choice.why` (metrics.json's `trainer`) says which
measurement decided. A resumed run keeps the trainer it started with (its checkpoint's).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from sae_lens.config import SAETrainerConfig

from circuitflow.measured import RESULTS
from circuitflow.sae import architectures
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.fast import SparseTopKTrainer
from circuitflow.sae.sparsity import SparsityController
from circuitflow.sae.stacked import Stack, StepSpec
from circuitflow.sae.stacked_trainer import StackedTrainer
from circuitflow.sae.trainer import ControlledSAETrainer
from circuitflow.sae.transcoder import is_transcoder

SPARSE_TRAINERS = ("fast", "gpu")  # the trainers of topk and batchtopk besides SAELens's
MEASURED_SIZE = "gpt2"  # benchmarks/sae_train.py's size whose rates decide


@dataclass(frozen=True)
class Choice:
    trainer: str  # fast | gpu | saelens
    chosen_by: str  # "sae.trainer" (set in the config), "auto", "checkpoint" (a resumed run)
    why: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def device_kind(device: str) -> str | None:
    """`cpu`, the GPU's name (e.g. `NVIDIA H200`), `cuda` where the GPU is not visible here (a
    login node planning a GPU job), or the device type."""
    kind = torch.device(device).type
    if kind == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return kind


@cache
def measured_rates(folder: str = str(RESULTS)) -> tuple[dict[str, Any], ...]:
    """Every committed sae_train result at MEASURED_SIZE: device type, GPU name, file, date and
    each trainer's tokens/s."""
    found = []
    for path in sorted(Path(folder).glob("sae_train-*.json")):
        try:
            data = json.loads(path.read_text())
            size = data["sizes"][MEASURED_SIZE]
        except (OSError, ValueError, KeyError):
            continue
        machine = data.get("machine", {})
        rates = {t: size[f"{t}_tokens_per_s"] for t in (*SPARSE_TRAINERS, "saelens")
                 if size.get(f"{t}_tokens_per_s")}  # fmt: skip
        found.append({"type": torch.device(machine.get("device", "cpu")).type,
                      "gpu": machine.get("gpu"), "file": path.name,
                      "created": data.get("created", ""), "rates": rates})  # fmt: skip
    return tuple(found)


def choose(cfg: SAETrainConfig, device: str, folder: Path | str = RESULTS) -> Choice:
    """The trainer for `cfg` on `device` (see the module's doc)."""
    kind = device_kind(device)
    return pick(cfg.trainer, cfg.architecture, torch.device(device).type, kind,
                measured_rates(str(folder)))  # fmt: skip


def pick(setting: str, architecture: str, dtype: str, kind: str | None,
         results: Sequence[dict[str, Any]]) -> Choice:  # fmt: skip
    """`choose` given the `sae.trainer` setting, the device's type and kind, and the measured
    results (measured_rates)."""
    if setting != "auto":
        return Choice(setting, "sae.trainer", "set in the config")
    if not architectures.get(architecture).sparse_trainer:
        return Choice("saelens", "auto", f"SAELens's trainer is the only one for {architecture}")
    results = [r for r in results if r["type"] == dtype and r["rates"]]
    mine = [r for r in results if dtype != "cuda" or r["gpu"] == kind]
    pool = mine or results
    if not pool:
        return Choice("saelens", "auto", f"no sae_train measurement on {dtype}: SAELens's "
                      "trainer, the reference")  # fmt: skip
    r = max(pool, key=lambda r: r["created"])
    best = max(r["rates"], key=r["rates"].get)
    where = r["gpu"] or dtype.upper()
    rates = ", ".join(f"{t} {v:,.0f}" for t, v in sorted(r["rates"].items(), key=lambda x: -x[1]))
    unseen = "this GPU is not visible here" if kind == dtype else f"none on {kind}"
    also = "" if mine else f" ({unseen}: the newest CUDA result)"
    return Choice(best, "auto", f"fastest measured on {where}{also}: tokens/s {rates} "
                  f"(benchmarks/results/{r['file']}, {r['created']})")  # fmt: skip


def resumed(choice: Choice, state: dict | None) -> Choice:
    """A resumed run's trainer: the one its checkpoint was trained with."""
    kept = (state or {}).get("trainer")
    if not kept or kept["trainer"] == choice.trainer:
        return choice
    return Choice(kept["trainer"], "checkpoint", f"the resumed run's ({kept['why']})")


# --- building -------------------------------------------------------------------------------------
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
