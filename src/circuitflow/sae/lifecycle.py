"""The life of a dictionary, shared by every source (`sae.source`): trained from captured
activations (sae.stage), from the model's own (sae.stream_stage), or published
(sae.pretrained_stage, which uses only the last step).

- `fingerprint`: what a training checkpoint's weights depend on: the config keys that can change
  a trained dictionary (`dictionary_config`, the one rule for both training sources) and the
  source's data; `resume_state` continues only a checkpoint made for the same fingerprint.
- `checkpointing`: the cadence of a training run's checkpoints (every `checkpoint_every_tokens`
  and at the next step after SIGTERM, then Interrupted) and `fit`, its loop timed (`Session`).
- `trained_metrics`: metrics.json of a trained dictionary, measured on the model.
- `write_dictionary`: the directory `saes/{site}/layer_{layer}/`, written atomically: the
  dictionary in SAELens's format, reloaded from disk and measured as downstream stages will load
  it, and its metrics.json (every source's keys: `METRICS_KEYS`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitflow import memory
from circuitflow.dictionary_sources import TRAINING_KEPT
from circuitflow.errors import CheckpointError
from circuitflow.io import atomic_dir, write_json
from circuitflow.perf import PassCounter
from circuitflow.resumable import Interrupted, StopFlag, sigterm_flag
from circuitflow.sae import architectures
from circuitflow.sae.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    set_aside,
)
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.metrics import evaluate_dictionary
from circuitflow.sae.sparsity import SparsityController, plot_history
from circuitflow.sae.trainer import ControlledSAETrainer, RunClock, dead_window_steps
from circuitflow.sae.trainer_choice import Choice
from circuitflow.sae.transcoder import is_transcoder, save_dictionary

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
# The keys of every dictionary's metrics.json, whatever its source (docs/outputs.md): what it is
# and where it reads, how it does spliced into the model, and what that cost. The report and
# scripts/compare_runs.py read these; each source adds its own beside them.
METRICS_KEYS = (
    "l0", "explained_variance", "ce_loss_recovered", "ce_clean", "ce_sae", "ce_zero",
    "dead_fraction", "tokens_trained", "wall_time_s", "peak_memory_mb", "source", "kind",
    "architecture", "d_in", "d_sae", "hook_name", "site", "layer", "device", "resumed",
    "forward_equivalents_per_prompt", "forward_equivalents_by_part",
    "forward_equivalents_total", "forward_equivalents_unit",
)  # fmt: skip


def metrics_line(metrics: dict[str, Any]) -> str:
    """A dictionary's metrics as its job prints them, one line: an explained variance the
    target gave no variance to (a constant site, an MLP that writes nothing) says so, and so
    does a dead dictionary (no latent fired: its reconstruction is its decoder bias)."""
    ev = metrics["explained_variance"]
    explained = (
        f"{ev:.3f}" if ev is not None
        else f"undefined (the target is constant: variance {metrics.get('target_variance', 0):.3g})"
    )  # fmt: skip
    return (
        f"{metrics['kind']} l0={metrics['l0']:.2f} explained_variance={explained} "
        f"ce_loss_recovered={metrics['ce_loss_recovered']} "
        f"dead_fraction={metrics['dead_fraction']:.3f}"
        + (" (dead dictionary: no latent fired)" if metrics["dead_fraction"] >= 1 else "")
    )


# `sae` keys that cannot change a trained dictionary, so a checkpoint survives their edit: the
# training sources' kept keys (their records': the evaluation, the checkpoint cadence, the other
# sources' sections; `sae.stream`: a stream group's members are in its fingerprint and its
# forward batch is kept by the checkpoint), and where it runs (a retry may land on another
# device). The rest of the run (walltimes, resources, the report) is outside the `sae` section.
NOT_DICTIONARY_KEYS = (*(k.removeprefix("sae.") for k in TRAINING_KEPT), "device")


# --- resume ---------------------------------------------------------------------------------------
def dictionary_config(cfg: SAETrainConfig) -> dict[str, Any]:
    """The config a trained dictionary depends on: the `sae` section and the seed, less
    NOT_DICTIONARY_KEYS."""
    return {k: v for k, v in cfg.to_dict().items() if k not in NOT_DICTIONARY_KEYS}


def fingerprint(cfg: SAETrainConfig, *data: Any) -> str:
    """What a checkpoint's weights depend on: `dictionary_config(cfg)` and `data`, the source's
    identity of what it trains on (JSON-able: the model and token set, hooks, layout)."""
    blob = json.dumps([dictionary_config(cfg), *data], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


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


def param_bytes(module: Any) -> int:
    """Bytes of a module's parameters: the model a training job keeps on the device for the
    evaluation, added back to the free memory its batch is planned in."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


# --- train ----------------------------------------------------------------------------------------
class Checkpoints:
    """When a training run checkpoints under `root`: every `every` tokens, but not at the end
    (the finished dictionary is written then), and at the next step after SIGTERM, after which
    the run stops with Interrupted (resumable: exit 75, and the rerun resumes)."""

    def __init__(self, root: Path, every: int, total: int, start: int, stop: StopFlag):
        self.root, self.every, self.total, self.stop = root, every, total, stop
        self.last = start  # tokens trained at the last checkpoint (or the resumed one)

    def after_step(
        self,
        samples: int,
        step: int,
        tensors: Callable[[], dict[str, torch.Tensor]],
        state: Callable[[], dict[str, Any]],
    ) -> None:
        """Called after each step with the tokens trained and the step's number (as saved:
        fit() increments its counter after the hook); `tensors` and `state` make the
        checkpoint's contents only when one is due."""
        done = samples >= self.total
        due = samples - self.last >= self.every
        if not (self.stop.requested or (due and not done)):
            return
        save_checkpoint(self.root, step, tensors(), state())
        self.last = samples
        if self.stop.requested:
            raise Interrupted(f"SIGTERM: checkpointed at {samples} tokens in {self.root}")


@contextmanager
def checkpointing(
    root: Path, cfg: SAETrainConfig, total: int, state: dict | None
) -> Iterator[Checkpoints]:
    """The cadence of a run training to `total` tokens, resumed from `state` when given, with
    SIGTERM caught for the duration of the block."""
    with sigterm_flag() as stop:
        start = state["n_training_samples"] if state else 0
        yield Checkpoints(root, cfg.checkpoint_every_tokens, total, start, stop)


@dataclass
class Session:
    """This session of a training run: the tokens trained before it (a resumed run), the wall
    time of its loop, and the clock of every session."""

    tokens_at_start: int
    session_s: float
    clock: RunClock

    @property
    def resumed(self) -> bool:
        return self.tokens_at_start > 0


def start_clock(state: dict | None) -> RunClock:
    """The run's wall clock, with a resumed run's earlier sessions counted."""
    clock = RunClock()
    if state is not None:
        clock.elapsed_before = state["wall_time_s"]
    return clock


def fit(trainer: Any, stream: Any, device: str, clock: RunClock) -> Session:
    """Run `trainer.fit()` (a trainer, or a group's, restored already where resumed) over
    `stream`, closed after it whatever happens, with the device's memory peak measured from here."""
    tokens_at_start = trainer.n_training_samples
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        trainer.fit()
    finally:
        stream.close()
    return Session(tokens_at_start, time.perf_counter() - t0, clock)


# --- measure and write ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HeldOut:
    """The contexts a dictionary is measured on, never trained on, and whether its data left
    BOS out (the dictionary is then bypassed there)."""

    contexts: torch.Tensor
    exclude_bos: bool
    bos_token_id: int


def dictionary_kind(saved: Any) -> str:
    """metrics.json's `kind`: this dictionary's, `sae` or `transcoder`."""
    return "transcoder" if is_transcoder(saved) else "sae"


def identity(saved: Any, site: str, layer: int) -> dict[str, Any]:
    """What the dictionary is and where it reads, from its saved config: a transcoder's
    `hook_name` its input, `hook_name_out` the output it predicts."""
    meta = saved.cfg.metadata
    out = {
        "kind": dictionary_kind(saved),
        "d_in": int(saved.cfg.d_in),
        "d_sae": int(saved.cfg.d_sae),
        "hook_name": meta.hook_name,
    }
    if is_transcoder(saved):
        out["hook_name_out"] = meta.hook_name_out
    return out | {"layer": layer, "site": site}


def trained_metrics(
    trainer: ControlledSAETrainer,
    controller: SparsityController | None,
    session: Session,
    cfg: SAETrainConfig,
    saved: Any,
    where: tuple[str, int],
    model: Any,
    held_out: HeldOut,
    device: str,
    planned_bytes: int,
    choice: Choice,
) -> dict[str, Any]:
    """metrics.json of a trained dictionary (`cfg` with its batch size planned): `saved`, as
    reloaded from disk, measured spliced into `model` on `held_out` (a transcoder: the
    explained variance of the MLP's output, the losses with its MLP replaced), and how its
    training went; `planned_bytes` the memory plan's peak of the training loop, `choice` the
    trainer that trained it and why (sae.trainers)."""
    site, layer = where
    since_fired = trainer.n_forward_passes_since_fired
    window = min(dead_window_steps(cfg), trainer.n_training_steps)
    counter = PassCounter()  # the evaluation's model passes (training steps are tokens_trained)
    quality = evaluate_dictionary(
        model, saved, layer, held_out.contexts, exclude_bos=held_out.exclude_bos,
        bos_token_id=held_out.bos_token_id, counter=counter,
    )  # fmt: skip
    # On CPU peak_memory_mb is the process's resident peak: the plan then counts the libraries.
    planned_bytes += 0 if device.startswith("cuda") else memory.runtime_bytes("model")
    trained = trainer.n_training_samples
    history = controller.state.history if controller else []
    return {
        **quality,
        "dead_fraction": (since_fired >= window).float().mean().item(),
        "tokens_trained": trained,
        "wall_time_s": session.clock.elapsed(),
        "tokens_per_s": (trained - session.tokens_at_start) / session.session_s,
        "peak_memory_mb": memory.peak_memory_bytes(device) / memory.MiB,
        "planned_memory_mb": planned_bytes / memory.MiB,
        "architecture": cfg.architecture,
        "trainer": choice.to_dict(),
        **identity(saved, site, layer),
        "device": device,
        "resumed": session.resumed,
        "sparsity_coefficient": architectures.get(cfg.architecture).controlled_coefficient,
        "controller_history": [
            {"step": int(s), "l0": l0, "coefficient": c} for s, l0, c in history
        ],
        "config": cfg.to_dict(),
        **counter.summary(len(held_out.contexts), unit="evaluation context"),
    }


def write_dictionary(
    out_dir: Path | str,
    source: str,
    save: Callable[[Path], None],
    device: str,
    measure: Callable[[Any], dict[str, Any]],
    figures: Callable[[Path, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The dictionary directory `out_dir` of any source, replaced atomically: `save(dir)`
    writes the dictionary in SAELens's format; it is reloaded from there and `measure(saved)`
    gives its metrics (measured on the artifact exactly as downstream stages load it), written
    to metrics.json with `source`; `figures(dir, metrics)` draws any plots beside it. Returns
    the metrics; ValueError when a key of METRICS_KEYS is missing (a source breaking the
    contract, caught by its tests)."""
    from sae_lens import SAE

    with atomic_dir(out_dir) as tmp:
        save(tmp)
        saved = SAE.load_from_disk(tmp, device=device).eval()
        metrics = {**measure(saved), "source": source}
        missing = [k for k in METRICS_KEYS if k not in metrics]
        if missing:
            raise ValueError(f"{out_dir}/{METRICS_FILE}: no {', '.join(missing)} (docs/outputs.md)")
        write_json(tmp / METRICS_FILE, metrics)
        if figures is not None:
            figures(tmp, metrics)
    return metrics


def write_trained(
    out_dir: Path | str,
    source: str,
    trainer: ControlledSAETrainer,
    controller: SparsityController | None,
    cfg: SAETrainConfig,
    device: str,
    measure: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:
    """A trained dictionary's directory (write_dictionary), with the sparsity controller's
    history drawn beside it (`sparsity_control.png`) where one steered its L0."""

    def controller_plot(tmp: Path, metrics: dict[str, Any]) -> None:
        if metrics["controller_history"]:
            plot_history(
                controller.state.history,
                cfg.target_l0,
                metrics["sparsity_coefficient"],
                tmp / "sparsity_control.png",
            )

    return write_dictionary(
        out_dir, source, lambda tmp: save_dictionary(trainer.sae, tmp), device, measure,
        controller_plot,
    )  # fmt: skip
