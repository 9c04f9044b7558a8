"""Out of memory in one batch of a GPU stage (injected by CIRCUITFLOW_INJECT_OOM, as on a CPU
machine): the stage halves its batch, logs it and finishes with the results of an unbroken run
(up to float rounding). Capture's own test is tests/capture (test_injected_oom_...)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from helpers.sae_data import tiny_model, write_capture
from helpers.spliced import tiny_spliced

from circuitflow import memory
from circuitflow.attribution import scores as attr
from circuitflow.attribution.config import AttributionConfig
from circuitflow.interventions.ablation import Intervener
from circuitflow.nodes import Node
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.stage import train_sae


@pytest.fixture(scope="module")
def tiny():
    return tiny_spliced(8)


def test_injection_hook_reads_the_stage_and_the_batch(monkeypatch):
    monkeypatch.setenv(memory.INJECT_OOM_ENV, "capture, attribution:2")
    assert memory.injected_oom("train_sae") is None
    inject = memory.injected_oom("attribution")
    inject(8)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="injected"):
        inject(8)
    inject(4)  # once only


def test_chunks_redo_the_failed_chunk_at_half_size_and_keep_it(monkeypatch, caplog):
    monkeypatch.setenv(memory.INJECT_OOM_ENV, "test:2")
    backoff = memory.OOMBackoff(4, "cpu", stage="test")
    with caplog.at_level(logging.WARNING):
        got = list(backoff.chunks(11, lambda a, b: list(range(a, b))))
    assert got == [[0, 1, 2, 3], [4, 5], [6, 7], [8, 9], [10]]
    assert backoff.batch_size == 2 and backoff.halvings == 1
    assert "test: out of memory: batch size halved to 2" in caplog.text


def test_attribution_halves_its_batch_and_scores_the_same(tiny, monkeypatch, caplog):
    model, saes, prompts = tiny
    cfg = AttributionConfig(method="ig", ig_steps=3, batch_size=8, validation_prompts=4)
    ref = attr.score_nodes(model, prompts, saes, cfg).frame
    monkeypatch.setenv(memory.INJECT_OOM_ENV, "attribution")
    with caplog.at_level(logging.WARNING):
        got = attr.score_nodes(model, prompts, saes, cfg).frame
    assert "attribution: out of memory: batch size halved to 4" in caplog.text
    for column in ("score_ig", "score_ig_selection", "score_exact"):
        np.testing.assert_allclose(got[column], ref[column], rtol=1e-4, atol=1e-6)


def test_interventions_halve_their_batch_and_measure_the_same(tiny, monkeypatch, caplog):
    model, saes, prompts = tiny
    nodes = [Node("head", 0, 1), Node("mlp", 1)]
    ref = Intervener(model, prompts, "mean", batch_size=8, saes=saes).run(nodes)
    monkeypatch.setenv(memory.INJECT_OOM_ENV, "interventions:2")
    with caplog.at_level(logging.WARNING):
        iv = Intervener(model, prompts, "mean", batch_size=8, saes=saes)
        got = iv.run(nodes)
    assert "interventions: out of memory: batch size halved to 4" in caplog.text
    assert iv.backoff.batch_size == 4
    np.testing.assert_allclose(got.logit_diff, ref.logit_diff, rtol=1e-5, atol=1e-6)


def test_sae_step_is_redone_in_micro_batches_with_the_same_result(tmp_path, monkeypatch, caplog):
    """The step that ran out of memory is redone as two accumulated halves: the same step,
    learning rate and data, so the SAE matches the unbroken run up to float rounding (the gpu
    trainer's halves: tests/sae/test_sae_stacked.py)."""
    model = tiny_model()
    acts = write_capture(model, tmp_path / "layer_0.h5", n_contexts=16)
    cfg = SAETrainConfig.from_dict(
        {"d_sae": 64, "k": 4, "batch_size": 256, "total_tokens": 2048, "lr_warm_up_steps": 2,
         "checkpoint_every_tokens": 100_000, "dead_window_tokens": 1024, "eval_contexts": 4,
         "shuffle_buffer_tokens": 1024}, device="cpu",
    )  # fmt: skip
    ref = train_sae(acts, tmp_path / "ref", cfg, model)
    monkeypatch.setenv(memory.INJECT_OOM_ENV, "train_sae:3")
    with caplog.at_level(logging.WARNING):
        got = train_sae(acts, tmp_path / "oom", cfg, model)
    assert "train_sae: out of memory: batch size halved to 128" in caplog.text
    assert got["tokens_trained"] == ref["tokens_trained"]
    for key in ("l0", "explained_variance", "dead_fraction"):
        assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
