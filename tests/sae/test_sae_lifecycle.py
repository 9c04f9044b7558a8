"""sae.lifecycle: one fingerprint rule for both training sources (a checkpoint survives the
edit of a key that cannot change the dictionary it is training, and is discarded, the run
starting over, when the edit can change it) and one writer of every source's directory."""

from __future__ import annotations

import os
import shutil
import signal

import numpy as np
import pytest
import torch
from helpers.sae_data import contexts as tiny_contexts
from helpers.sae_data import tiny_model, write_capture

from circuitflow import config as cf
from circuitflow.capture.config import CaptureConfig
from circuitflow.resumable import Interrupted
from circuitflow.sae import lifecycle
from circuitflow.sae.checkpoint import list_checkpoints
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.stage import train_sae
from circuitflow.sae.stream_stage import train_stream_group

torch.set_num_threads(1)
BASE = {
    "architecture": "topk",
    "k": 8,
    "total_tokens": 4_096,
    "batch_size": 256,
    "checkpoint_every_tokens": 1_024,
    "shuffle_buffer_tokens": 1_024,
    "eval_contexts": 8,
    "stream": {"batch_contexts": 16},
}
# Edits that cannot change a trained dictionary: the checkpoint is kept and the run resumes.
KEEPS = {
    "sae.stream.batch_contexts": {"stream": {"batch_contexts": 8}},
    "sae.stream.layers_per_job": {"stream": {"batch_contexts": 16, "layers_per_job": 1}},
    "sae.pretrained.release": {"pretrained": {"release": "gpt2-small-res-jb"}},
    "sae.eval_contexts": {"eval_contexts": 4},
    "sae.checkpoint_every_tokens": {"checkpoint_every_tokens": 2_048},
}
# Edits that can: the checkpoint is discarded and the run starts over.
DISCARDS = {"sae.lr": {"lr": 1e-3}, "seed": {"seed": 1}, "sae.k": {"k": 4}}


def sae_config(config: dict) -> SAETrainConfig:
    """The `sae` section, with the master seed where `config` sets one."""
    section = {k: v for k, v in config.items() if k != "seed"}
    seed = {"seed": config["seed"]} if "seed" in config else {}
    return SAETrainConfig.from_dict(section, **seed)


def capture_run(root, config: dict, ckpt) -> dict:
    model = tiny_model()
    acts = root / "activations" / "layer_0.h5"
    if not acts.exists():
        write_capture(model, acts, n_contexts=32)
    return train_sae(acts, root / "out", sae_config(config), model, ckpt)


def stream_run(root, config: dict, ckpt) -> dict:
    toks = tiny_contexts(40, seed=7).numpy().astype(np.int32)
    meta = {"model_hash": "m0", "token_set_hash": "t0", "bos_token_id": 0,
            "held_out_contexts": 8}  # fmt: skip
    found = train_stream_group(toks, meta, [("resid_post", 0)], [root / "out"],
                               sae_config(config), CaptureConfig(), tiny_model(),
                               ckpt)  # fmt: skip
    return next(iter(found.values()))


SOURCES = {"capture": capture_run, "stream": stream_run}


@pytest.fixture(scope="module", params=list(SOURCES))
def interrupted(request, tmp_path_factory):
    """A run of the source stopped by SIGTERM right after its first checkpoint."""
    source = request.param
    root = tmp_path_factory.mktemp(source)
    save = lifecycle.save_checkpoint

    def save_then_sigterm(*args, **kwargs):
        path = save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # as Slurm's walltime warning would
        return path

    lifecycle.save_checkpoint = save_then_sigterm
    try:
        with pytest.raises(Interrupted):
            SOURCES[source](root, BASE, root / "ckpt")
    finally:
        lifecycle.save_checkpoint = save
    assert len(list_checkpoints(root / "ckpt")) == 1
    return source, root


def rerun(interrupted, tmp_path, edit: dict) -> dict:
    """The interrupted run's checkpoint rerun with `edit` applied to its config."""
    source, root = interrupted
    shutil.copytree(root / "ckpt", tmp_path / "ckpt")
    (tmp_path / "activations").symlink_to(root / "activations", target_is_directory=True)
    return SOURCES[source](tmp_path, BASE | edit, tmp_path / "ckpt")


@pytest.mark.parametrize("edit", KEEPS.values(), ids=KEEPS.keys())
def test_an_edit_that_cannot_change_the_dictionary_keeps_its_checkpoint(
    interrupted, tmp_path, edit
):
    metrics = rerun(interrupted, tmp_path, edit)
    assert metrics["resumed"] is True and metrics["source"] == interrupted[0]
    assert metrics["tokens_trained"] == BASE["total_tokens"]
    assert not (tmp_path / "ckpt").exists()  # finished: the checkpoints are gone


@pytest.mark.parametrize("edit", DISCARDS.values(), ids=DISCARDS.keys())
def test_an_edit_that_can_change_the_dictionary_discards_its_checkpoint(
    interrupted, tmp_path, edit
):
    metrics = rerun(interrupted, tmp_path, edit)
    assert metrics["resumed"] is False
    assert metrics["tokens_trained"] == BASE["total_tokens"]


def test_the_rule_reads_only_the_sae_section_and_the_seed():
    """What lies outside the sae section (the stages after it, the behaviours) never reaches
    a dictionary's fingerprint; the seed does."""
    base = cf.resolve({})
    fp = lifecycle.fingerprint(SAETrainConfig.from_config(base), "data")
    others = [
        {"attribution": {"ig_steps": 3}},
        {"interventions": {"n_seeds": 7}},
        {"baseline": {"batch_size": 8}},
    ]
    for edit in others:
        edited = cf.resolve(edit)
        assert edited != base, edit
        assert lifecycle.fingerprint(SAETrainConfig.from_config(edited), "data") == fp, edit
    seeded = SAETrainConfig.from_config(cf.resolve({"seed": 5}))
    assert lifecycle.fingerprint(seeded, "data") != fp
    assert lifecycle.fingerprint(SAETrainConfig.from_config(base), "other data") != fp


def test_the_writer_refuses_metrics_without_the_contracts_keys(tmp_path):
    """A source whose metrics.json would lack a key every dictionary's has is refused in one
    line naming the key, and nothing is written."""
    from sae_lens import StandardSAE, StandardSAEConfig

    sae = StandardSAE(StandardSAEConfig(d_in=4, d_sae=8))
    full = dict.fromkeys(lifecycle.METRICS_KEYS, 0)

    def measured(saved):  # reads the dictionary as written
        return full | {"d_sae": saved.cfg.d_sae}

    metrics = lifecycle.write_dictionary(tmp_path / "ok", "test", sae.save_model, "cpu", measured)
    assert metrics["source"] == "test" and metrics["d_sae"] == 8
    assert (tmp_path / "ok" / "metrics.json").is_file()
    partial = {k: v for k, v in full.items() if k != "hook_name"}
    with pytest.raises(ValueError, match=r"metrics.json: no hook_name \(docs/outputs.md\)"):
        lifecycle.write_dictionary(
            tmp_path / "bad", "test", sae.save_model, "cpu", lambda saved: partial
        )
    assert not (tmp_path / "bad").exists()
