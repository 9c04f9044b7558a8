"""Streaming SAE training (sae.source: stream): the stream is the model's own activations in a
deterministic order; a group of SAEs trains as its members would alone; SIGTERM or SIGKILL and a
rerun give the uninterrupted run's weights, bit for bit."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.forked import Forked
from helpers.sae_data import contexts as tiny_contexts
from helpers.sae_data import tiny_model
from helpers.transcoders import swapped_loss
from safetensors.torch import load_file

from circuitflow.capture.config import CaptureConfig
from circuitflow.errors import EXIT_CHECKPOINTED
from circuitflow.nodes import hook_name
from circuitflow.sae.checkpoint import list_checkpoints, load_checkpoint
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.files import load_sae
from circuitflow.sae.stream import ModelActivationStream, StreamLayout
from circuitflow.sae.stream_stage import train_stream_group
from circuitflow.sae.transcoder import TopKTranscoder

torch.set_num_threads(1)
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
MEMBERS = [("resid_post", 0), ("resid_post", 1)]
# The fast TopK trainer with latents dead after 8 silent steps (AuxK in play), activation
# scaling estimated from the stream, and a buffer of 64 contexts, so a run crosses buffers and
# epochs (150 training contexts, 16 rows each: 2,400 rows an epoch).
CFG = {
    "architecture": "topk",
    "k": 8,
    "total_tokens": 49_152,
    "batch_size": 256,
    "checkpoint_every_tokens": 4_096,
    "dead_window_tokens": 2_048,
    "shuffle_buffer_tokens": 1_024,
    "eval_contexts": 8,
    "normalize_activations": "expected_average_only_in",
    "stream": {"batch_contexts": 16},
}
# SAELens's trainer for a standard SAE, its L1 coefficient steered by the PI controller.
STANDARD = {**CFG, "architecture": "standard", "target_l0": 8, "l1_coefficient": 0.1}
# Transcoders (sae.kind transcoder): each member reads its layer's MLP input and output.
TRANSCODER = {**CFG, "kind": "transcoder"}
# The gpu trainer: the group's transcoders step as one stack (sae.stacked).
STACKED = {**TRANSCODER, "trainer": "gpu"}


def members_of(config: dict) -> list[tuple[str, int]]:
    if config.get("kind") == "transcoder":
        return [("mlp_out", layer) for _, layer in MEMBERS]
    return MEMBERS


def token_set(n_contexts: int = 158, held_out: int = 8) -> tuple[np.ndarray, dict]:
    toks = tiny_contexts(n_contexts, seed=7).numpy().astype(np.int32)
    meta = {"model_hash": "m0", "token_set_hash": "t0", "bos_token_id": 0,
            "held_out_contexts": held_out}  # fmt: skip
    return toks, meta


def test_the_stream_is_the_models_activations_in_a_seeded_order():
    """Each batch holds, for every hook, the same rows of the layout's contexts, as a direct
    forward pass of those contexts computes them (stored in float16); a stream opened at
    position p continues the sequence from batch p, across buffers and epochs."""
    model = tiny_model()
    toks, _ = token_set()
    layout = StreamLayout(n_contexts=150, rows_per_context=16, buffer_contexts=40, seed=3)

    def stream(position: int = 0) -> ModelActivationStream:
        return ModelActivationStream(model, toks, HOOKS, layout, 100, 8, 2, position=position)

    first = [next(s) for s in [stream()] for _ in range(60)]  # 6,000 rows: 2.5 epochs
    # The expected rows: each group's contexts through the model in passes of 8, as stored.
    expected = {h: [] for h in HOOKS}
    for epoch in range(3):
        order = layout.epoch_order(epoch)
        for g in range(layout.n_groups):
            ctx = order[g * 40 : (g + 1) * 40]
            acts = {h: [] for h in HOOKS}
            for a in range(0, len(ctx), 8):
                batch = torch.from_numpy(toks[ctx[a : a + 8]].astype(np.int64))
                _, cache = model.run_with_cache(batch, names_filter=HOOKS, stop_at_layer=2)
                for h in HOOKS:
                    acts[h].append(cache[h][:, 1:].reshape(-1, 32).half())
            rows = layout.row_order(epoch, g, len(ctx) * 16)
            for h in HOOKS:
                expected[h].append(torch.cat(acts[h])[torch.from_numpy(rows)].float())
    for h in HOOKS:
        want = torch.cat(expected[h])[: 60 * 100]
        got = torch.cat([b[h] for b in first])
        assert torch.equal(got, want), h
    # Rows of one batch come from many contexts (a shuffle buffer of 40 contexts).
    group0 = layout.epoch_order(0)[:40]
    pos = torch.from_numpy(layout.row_order(0, 0, 640)[:100]) // 16
    assert len(set(group0[pos.numpy()])) >= 30
    # Resume anywhere: mid-buffer (batch 7), at a buffer's edge and across an epoch (24, 30).
    for p in (7, 24, 30):
        s = stream(p)
        for i in range(p, p + 6):
            got = next(s)
            assert all(torch.equal(got[h], first[i][h]) for h in HOOKS), (p, i)
        assert s.position == p + 6
    # Seeking back into the buffer in hand (as after the activation scaling's estimate) runs
    # no forward pass again; seeking to another buffer recomputes it, the same rows.
    s = stream()
    [next(s) for _ in range(5)]
    passes = s.counter.total()
    assert passes == 40 * 2 / 2  # one buffer of 40 contexts through both of 2 layers
    s.seek(0)
    got = next(s)
    assert all(torch.equal(got[h], first[0][h]) for h in HOOKS)
    assert s.counter.total() == passes
    s.seek(30)
    got = next(s)
    assert all(torch.equal(got[h], first[30][h]) for h in HOOKS)
    assert s.counter.total() > passes


@pytest.mark.parametrize("trainer", ["auto", "gpu"])
def test_a_group_trains_its_members_as_single_jobs_would(tmp_path, trainer):
    """Two layers from one stream give the SAEs, bit for bit, that two one-layer jobs give
    (each hook's rows, initialisation and steps do not depend on the group; with the gpu
    trainer the two step as one stack, a batched matmul whose members are each a one-SAE
    stack's), and the one-pass job counts half the forward passes of the two jobs together:
    its passes go as deep as its deepest layer once, theirs through one and two layers."""
    model = tiny_model()
    toks, meta = token_set()
    cfg = SAETrainConfig.from_dict({**CFG, "total_tokens": 8_192, "trainer": trainer})
    capture = CaptureConfig()
    both = train_stream_group(toks, meta, MEMBERS, [tmp_path / "g0", tmp_path / "g1"], cfg,
                              capture, model, tmp_path / "ck")  # fmt: skip
    alone = {}
    for i, member in enumerate(MEMBERS):
        out = tmp_path / f"s{i}"
        alone |= train_stream_group(toks, meta, [member], [out], cfg, capture, model,
                                    tmp_path / f"ck{i}")  # fmt: skip
        a = load_file(out / "sae_weights.safetensors")
        b = load_file(tmp_path / f"g{i}" / "sae_weights.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), member
    for hook in HOOKS:
        assert both[hook]["l0"] == alone[hook]["l0"]
        assert both[hook]["explained_variance"] > 0.5
        assert both[hook]["trainer"]["trainer"] == ("fast" if trainer == "auto" else "gpu")
        assert both[hook]["source"] == "stream" and both[hook]["tokens_trained"] == 8_192
    group = both[HOOKS[0]]["stream"]
    singles = [alone[h]["stream"]["forward_equivalents"] for h in HOOKS]
    # Depth 1 of 2 layers, then 2 of 2: half a pass and a whole one per context.
    assert singles[1] == pytest.approx(2 * singles[0])
    assert group["forward_equivalents"] == pytest.approx(singles[1])
    assert group["stop_at_layer"] == 2 and group["members"] == HOOKS
    assert group["activation_bytes_written"] == 0
    assert not list(tmp_path.rglob("*.h5")), "the stream wrote an activation file"


def test_a_group_of_transcoders_reads_each_mlps_input_and_output(tmp_path):
    """sae.kind transcoder from one stream: each member reads its layer's MLP input and predicts
    its output, from the same forward passes (counted once, as deep as the deeper layer), and
    its metrics are the model's with that MLP module swapped for it (helpers.transcoders)."""
    model = tiny_model()
    toks, meta = token_set()
    members = members_of(TRANSCODER)
    cfg = SAETrainConfig.from_dict({**TRANSCODER, "total_tokens": 16_384})
    outs = [tmp_path / f"layer_{layer}" for _, layer in members]
    found = train_stream_group(toks, meta, members, outs, cfg, CaptureConfig(), model,
                               tmp_path / "ck")  # fmt: skip
    held_out = torch.from_numpy(toks[-cfg.eval_contexts :].astype(np.int64))
    for (_, layer), out in zip(members, outs, strict=True):
        tc = load_sae(out)
        assert isinstance(tc, TopKTranscoder)
        m = found[f"blocks.{layer}.hook_mlp_out"]
        assert (m["kind"], m["site"], m["hook_name"]) == (
            "transcoder",
            "mlp_out",
            f"blocks.{layer}.ln2.hook_normalized",
        )
        assert m["explained_variance"] > 0.8, m
        assert m["ce_sae"] == pytest.approx(swapped_loss(model, {layer: tc}, held_out), abs=1e-5)
    stream = found["blocks.1.hook_mlp_out"]["stream"]
    assert stream["stop_at_layer"] == 2
    assert stream["members"] == ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]


def test_a_group_of_an_sae_and_a_transcoder_trains_each_as_alone(tmp_path):
    """sae.kind both: a layer's residual SAE and its transcoder from one stream are, bit for
    bit, what a one-member job of each kind gives (the SAE reads its hook, the transcoder its
    MLP's input and output), and each one's metrics name its own kind."""
    model = tiny_model()
    toks, meta = token_set()
    small = {**CFG, "total_tokens": 8_192}
    members = [("resid_post", 1), ("mlp_out", 1)]
    outs = [tmp_path / "sae", tmp_path / "transcoder"]
    found = train_stream_group(toks, meta, members, outs,
                               SAETrainConfig.from_dict({**small, "kind": "both"}),
                               CaptureConfig(), model, tmp_path / "ck")  # fmt: skip
    for (site, layer), out, kind in zip(members, outs, ("sae", "transcoder"), strict=True):
        alone = tmp_path / f"alone_{kind}"
        train_stream_group(toks, meta, [(site, layer)], [alone],
                           SAETrainConfig.from_dict({**small, "kind": kind}), CaptureConfig(),
                           model, tmp_path / f"ck_{kind}")  # fmt: skip
        a = load_file(alone / "sae_weights.safetensors")
        b = load_file(out / "sae_weights.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), kind
        assert found[hook_name(site, layer)]["kind"] == kind
    assert isinstance(load_sae(outs[1]), TopKTranscoder)
    assert not isinstance(load_sae(outs[0]), TopKTranscoder)


def _run(out: Path, ckpt: Path, config: dict) -> Forked:
    """The group's training in a process of its own (forked: its imports done)."""

    def train() -> None:
        toks, meta = token_set()
        members = members_of(config)
        outs = [out / f"layer_{layer}" for _, layer in members]
        train_stream_group(toks, meta, members, outs, SAETrainConfig.from_dict(config),
                           CaptureConfig(), tiny_model(), ckpt)  # fmt: skip

    return Forked(train)


@pytest.mark.parametrize(
    ("config", "kill"),
    [
        (CFG, signal.SIGTERM),
        (CFG, signal.SIGKILL),
        (STANDARD, signal.SIGTERM),
        (TRANSCODER, signal.SIGKILL),
        (STACKED, signal.SIGTERM),
    ],
    ids=[
        "fast-topk-sigterm",
        "fast-topk-sigkill",
        "saelens-standard-sigterm",
        "transcoder",
        "gpu-stacked-sigterm",
    ],  # fmt: skip
)
def test_kill_and_rerun_matches_the_uninterrupted_run(tmp_path, config, kill):
    """SIGTERM (Slurm's walltime warning: checkpoint now, exit 75) or SIGKILL (no warning: the
    last periodic checkpoint) mid-run, then a rerun: every SAE of the group is the
    uninterrupted run's, bit for bit, and so are its dead latents and L0 controller."""
    ref_dir = tmp_path / "ref"
    toks, meta = token_set()
    members = members_of(config)
    outs = [ref_dir / f"layer_{layer}" for _, layer in members]
    found = train_stream_group(toks, meta, members, outs, SAETrainConfig.from_dict(config),
                               CaptureConfig(), tiny_model(), tmp_path / "ref.ckpt")  # fmt: skip
    ref = {layer: found[hook_name(site, layer)] for site, layer in members}
    assert all(m["tokens_trained"] == 49_152 for m in ref.values())

    out, ckpt = tmp_path / "run", tmp_path / "run.ckpt"
    proc = _run(out, ckpt, config)
    deadline = time.time() + 120
    while not list_checkpoints(ckpt) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(kill)
    _, err = proc.communicate(timeout=120)
    if kill == signal.SIGTERM:
        assert proc.returncode == EXIT_CHECKPOINTED, err
        assert "SIGTERM: checkpointed" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    _, state = load_checkpoint(list_checkpoints(ckpt)[-1])
    assert 0 < state["n_training_samples"] < config["total_tokens"]
    assert len(state["members"]) == 2 and state["data_position"] > 0

    proc = _run(out, ckpt, config)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert not ckpt.exists()
    for _, layer in MEMBERS:
        got = json.loads((out / f"layer_{layer}" / "metrics.json").read_text())
        assert got["resumed"] is True and got["tokens_trained"] == 49_152
        a = load_file(out / f"layer_{layer}" / "sae_weights.safetensors")
        b = load_file(ref_dir / f"layer_{layer}" / "sae_weights.safetensors")
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (layer, k)
        assert got["dead_fraction"] == ref[layer]["dead_fraction"]
        assert got["controller_history"] == ref[layer]["controller_history"]
        assert (len(got["controller_history"]) > 0) == (config["architecture"] == "standard")
        # The resumed run recomputed the buffer it stopped in: more passes, counted.
        assert got["stream"]["forward_equivalents"] >= ref[layer]["stream"]["forward_equivalents"]
