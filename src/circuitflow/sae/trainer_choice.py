"""`sae.trainer: auto`: the trainer measured fastest on this kind of device (torch-free, so the
planners can ask it).

Among the trainers that can train the architecture (sae.trainers: `fast`, `gpu`, `saelens` for
TopK and BatchTopK; SAELens's alone for the rest), the one with the highest tokens/s in the
committed results of benchmarks/sae_train.py at GPT-2 small's size
(`benchmarks/results/sae_train-*.json`, headline size gpt2: `make bench-gpu` on a GPU, the CPU
command in the script's doc), each trainer measured side by side on the same tokens. A GPU with
no result of its own takes the newest result of another CUDA GPU; a device type with none (e.g.
mps) gets SAELens's trainer, the reference. The same repository on the same kind of device
therefore always picks the same trainer, and `Choice.why` (metrics.json's `trainer`) says which
measurement decided. A resumed run keeps the trainer it started with (`resumed`).

A GPU's kind is its name (torch.cuda.get_device_name) once the process has initialised CUDA, as
every job has by the time it trains; a planner, which does not, plans with the newest CUDA
result (the job plans its batch again on its own GPU).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from circuitflow.measured import RESULTS
from circuitflow.sae import architectures

TRAINERS = ("fast", "gpu", "saelens")  # what auto picks among (the schema adds auto)
MEASURED_SIZE = "gpt2"  # benchmarks/sae_train.py's size whose rates decide


@dataclass(frozen=True)
class Choice:
    trainer: str  # fast | gpu | saelens
    chosen_by: str  # "sae.trainer" (set in the config), "auto", "checkpoint" (a resumed run)
    why: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def device_kind(device: str) -> tuple[str, str]:
    """(device type, kind): `cpu`; the GPU's name (e.g. `NVIDIA H200`) once this process has
    initialised CUDA (a job, its model loaded), else `cuda` (a planner); else the type."""
    dtype = device.split(":")[0]
    torch = sys.modules.get("torch")
    if dtype == "cuda" and torch is not None and torch.cuda.is_initialized():
        return dtype, torch.cuda.get_device_name(torch.device(device))
    return dtype, dtype


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
        rates = {t: size[f"{t}_tokens_per_s"] for t in TRAINERS if size.get(f"{t}_tokens_per_s")}
        found.append({"type": machine.get("device", "cpu").split(":")[0],
                      "gpu": machine.get("gpu"), "file": path.name,
                      "created": data.get("created", ""), "rates": rates})  # fmt: skip
    return tuple(found)


def choose(cfg: Any, device: str, folder: Path | str = RESULTS) -> Choice:
    """The trainer for `cfg` (sae.config.SAETrainConfig) on `device` (see the module's doc)."""
    dtype, kind = device_kind(device)
    return pick(cfg.trainer, cfg.architecture, dtype, kind, measured_rates(str(folder)))


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
