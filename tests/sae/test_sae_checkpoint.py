"""Checkpoint/resume: SIGTERM mid-training, rerun, and compare with an uninterrupted run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers.forked import Forked
from helpers.sae_data import tiny_model, write_capture
from safetensors.torch import load_file

from circuitflow.errors import EXIT_CHECKPOINTED, CheckpointError
from circuitflow.resumable import Interrupted
from circuitflow.sae.checkpoint import list_checkpoints, load_checkpoint
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.stage import train_sae

torch.set_num_threads(1)
CFG = {
    "architecture": "standard",
    "target_l0": 8,
    "l1_coefficient": 0.1,
    "total_tokens": 200_000,
    "batch_size": 256,
    "checkpoint_every_tokens": 20_000,
    "eval_contexts": 8,
}
# The fast trainer (sae.fast), with latents dead after 8 silent steps so its AuxK loss and
# firing statistics are in play on both sides of the checkpoint.
FAST_CFG = {
    "architecture": "topk",
    "k": 8,
    "total_tokens": 200_000,
    "batch_size": 256,
    "checkpoint_every_tokens": 20_000,
    "dead_window_tokens": 2048,
    "eval_contexts": 8,
}
# A transcoder (sae.kind transcoder) on the fast trainer: two files read in one order, resumed.
TRANSCODER_CFG = FAST_CFG | {"kind": "transcoder"}


def _run(acts: list[str], out: Path, config: dict) -> Forked:
    """The stage's training in a process of its own (forked: its imports done)."""
    return Forked(lambda: train_sae(acts, out, SAETrainConfig.from_dict(config), tiny_model()))


@pytest.mark.parametrize(
    "config",
    [CFG, FAST_CFG, TRANSCODER_CFG],
    ids=["saelens-standard", "fast-topk", "fast-topk-transcoder"],
)
def test_sigterm_checkpoint_and_resume_matches_uninterrupted(tmp_path, config):
    import json

    model = tiny_model()
    sites = ["mlp_in", "mlp_out"] if config.get("kind") == "transcoder" else ["resid_post"]
    acts = [
        str(write_capture(model, tmp_path / site / "layer_0.h5", n_contexts=128, site=site))
        for site in sites
    ]
    ref = train_sae(acts, tmp_path / "ref", SAETrainConfig.from_dict(config), model)

    out = tmp_path / "run"
    ckpt_root = out.with_name("run.ckpt")
    proc = _run(acts, out, config)
    deadline = time.time() + 120
    while not list_checkpoints(ckpt_root) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_CHECKPOINTED, err
    assert "SIGTERM: checkpointed" in err
    assert not out.exists()
    _, state = load_checkpoint(list_checkpoints(ckpt_root)[-1])
    assert 0 < state["n_training_samples"] < config["total_tokens"]

    proc = _run(acts, out, config)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert not ckpt_root.exists()
    got = json.loads((out / "metrics.json").read_text())
    assert got["resumed"] is True and got["tokens_trained"] == ref["tokens_trained"]
    # Bit for bit the weights, dead latents and controller trajectory of the run that was never
    # interrupted.
    a, b = (
        load_file(out / "sae_weights.safetensors"),
        load_file(tmp_path / "ref/sae_weights.safetensors"),
    )
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert got["dead_fraction"] == ref["dead_fraction"]
    hist = [[h["step"], h["l0"], h["coefficient"]] for h in got["controller_history"]]
    ref_hist = [[h["step"], h["l0"], h["coefficient"]] for h in ref["controller_history"]]
    assert hist == ref_hist
    assert (len(hist) > 0) == (config["architecture"] == "standard")


def test_corrupt_checkpoint_is_set_aside_and_training_goes_on(tmp_path, caplog):
    """A damaged checkpoint (truncated by a full disk) is refused by load_checkpoint, then set
    aside with a warning by the stage, which resumes from the one before it: a Slurm retry never
    fails on the same file again."""
    model = tiny_model()
    acts = write_capture(model, tmp_path / "layer_0.h5", n_contexts=16)
    cfg = SAETrainConfig.from_dict({**CFG, "total_tokens": 4_096, "checkpoint_every_tokens": 1024})
    ckpt_root = tmp_path / "ck"
    from circuitflow.sae import lifecycle

    # Stop right after the second checkpoint by faking a SIGTERM from inside the run.
    orig = lifecycle.save_checkpoint
    calls = []

    def save_then_stop(*a, **kw):
        calls.append(1)
        path = orig(*a, **kw)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return path

    lifecycle.save_checkpoint = save_then_stop
    try:
        with pytest.raises(Interrupted):
            train_sae(acts, tmp_path / "out", cfg, model, checkpoint_dir=ckpt_root)
    finally:
        lifecycle.save_checkpoint = orig
    older, newest = list_checkpoints(ckpt_root)[-2:]
    tensors = newest / "tensors.safetensors"
    data = tensors.read_bytes()
    tensors.write_bytes(data[: len(data) // 2])  # truncated, as by a full disk
    with pytest.raises(CheckpointError, match=rf"{newest.name}.*truncated or corrupt"):
        load_checkpoint(newest)
    state, _ = lifecycle.resume_state(ckpt_root, load_checkpoint(older)[1]["fingerprint"])
    assert state["n_training_steps"] == load_checkpoint(older)[1]["n_training_steps"]
    assert (ckpt_root / "corrupt" / newest.name).is_dir() and not newest.exists()
    assert f"{newest.name}: checkpoint tensors are missing, truncated or corrupt" in caplog.text
    (older / "state.json").write_text('{"format": 1, "st')
    with pytest.raises(CheckpointError, match=rf"{older.name}.*unreadable"):
        load_checkpoint(older)
    # Nothing sound left: training starts over and finishes.
    metrics = train_sae(acts, tmp_path / "out", cfg, model, checkpoint_dir=ckpt_root)
    assert metrics["resumed"] is False and metrics["tokens_trained"] == 4_096
    assert (tmp_path / "out" / "metrics.json").is_file()
