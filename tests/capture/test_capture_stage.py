"""Capture stage, in process: values, layout, one forward pass, OOM back-off, shards, reader."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuitflow.capture import stage as cap
from circuitflow.capture.config import CaptureConfig
from circuitflow.capture.files import merge_shards, open_activations, partial_path
from circuitflow.errors import ActivationFileError

META = {"model_hash": "m" * 8, "token_set_hash": "t" * 8, "bos_token_id": 0}
SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


@pytest.fixture(scope="module")
def model():
    cfg = HookedTransformerConfig(
        n_layers=3, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=12, d_vocab=20,
        act_fn="gelu", normalization_type="LN", seed=0,
    )  # fmt: skip
    return HookedTransformer(cfg).eval()


@pytest.fixture(scope="module")
def tokens():
    toks = np.random.default_rng(0).integers(1, 20, size=(37, 12)).astype(np.int32)
    toks[:, 0] = 0
    return toks


def run(model, tokens, out, layers=(0, 2), sites=SITES, **kw):
    opts = CaptureConfig(**({"dtype": "float32", "batch_size": 8, "checkpoint_tokens": 50} | kw))
    targets = {(s, layer): out / s / f"layer_{layer}.h5" for s in sites for layer in layers}
    result = cap.capture(model, tokens, META, targets, opts, progress=False)
    return targets, result


@pytest.mark.parametrize("exclude_bos", [True, False])
def test_values_layout_and_attrs(model, tokens, tmp_path, exclude_bos):
    targets, result = run(model, tokens, tmp_path, exclude_bos=exclude_bos)
    with torch.inference_mode():
        _, cache = model.run_with_cache(torch.from_numpy(tokens.astype(np.int64)))
    skip = 1 if exclude_bos else 0
    for (site, layer), path in targets.items():
        assert not partial_path(path).exists()
        with h5py.File(path, "r") as f:  # plain h5py reads it
            a = f.attrs
            want = cache[f"blocks.{layer}.hook_{site}"][:, skip:].reshape(-1, 16).numpy()
            np.testing.assert_allclose(f["acts"][:], want, rtol=1e-5, atol=1e-5)
            assert f["acts"].dtype == np.float32 and f["acts"].chunks is not None
            assert f["tokens"].dtype == np.int32
            per = 12 - skip
            ctx = f["tokens"][:].reshape(-1, per)
            if exclude_bos:
                ctx = np.concatenate([np.full((len(ctx), 1), a["bos_token_id"]), ctx], axis=1)
            np.testing.assert_array_equal(ctx, tokens)
            assert a["hook_name"] == f"blocks.{layer}.hook_{site}"
            assert (a["layer"], a["site"], a["dtype"]) == (layer, site, "float32")
            assert a["n_tokens"] == 37 * per and a["d_in"] == 16 and a["context_length"] == 12
            assert bool(a["bos_excluded"]) is exclude_bos and bool(a["complete"]) is True
            assert a["model_hash"] == META["model_hash"]
            assert a["token_set_hash"] == META["token_set_hash"]
        open_activations(path).close()
    assert result.n_tokens == 37 * (12 - skip)


def test_one_forward_pass_serves_every_layer(model, tokens, tmp_path):
    """Per batch: one embedding call, and blocks past the deepest captured layer never run."""
    calls = {"embed": 0, "block2": 0}

    def count(name):
        def hook(act, hook):
            calls[name] += 1

        return hook

    model.add_hook("hook_embed", count("embed"))
    model.add_hook("blocks.2.hook_resid_pre", count("block2"))
    try:
        run(model, tokens, tmp_path, layers=(0, 1), batch_size=8, checkpoint_tokens=10_000)
    finally:
        model.reset_hooks()
    assert calls == {"embed": 5, "block2": 0}  # ceil(37 / 8) batches, stop_at_layer = 2


def test_float16_storage(model, tokens, tmp_path):
    targets, _ = run(model, tokens, tmp_path, layers=(1,), sites=("resid_post",), dtype="float16")
    with open_activations(targets[("resid_post", 1)]) as f:
        assert f["acts"].dtype == np.float16 and f.attrs["dtype"] == "float16"


def test_injected_oom_halves_batch_and_keeps_it(model, tokens, tmp_path):
    sizes = []

    def inject(batch_size):
        sizes.append(batch_size)
        if batch_size > 2:
            raise torch.cuda.OutOfMemoryError("injected")

    opts = CaptureConfig(dtype="float32", batch_size=16, checkpoint_tokens=50)
    target = {("resid_post", 2): tmp_path / "oom.h5"}
    result = cap.capture(model, tokens, META, target, opts, inject_oom=inject, progress=False)
    assert result.batch_size == 2
    assert sizes[:4] == [16, 8, 4, 2] and set(sizes[4:]) == {2}
    ref, _ = run(model, tokens, tmp_path / "ref", layers=(2,), sites=("resid_post",))
    with (
        open_activations(target[("resid_post", 2)]) as f,
        open_activations(ref[("resid_post", 2)]) as g,
    ):
        np.testing.assert_allclose(f["acts"][:], g["acts"][:], rtol=1e-5, atol=1e-6)


def test_oom_at_batch_size_one_fails_clearly(model, tokens, tmp_path):
    def inject(batch_size):
        raise torch.cuda.OutOfMemoryError("injected")

    opts = CaptureConfig(dtype="float32", batch_size=2)
    with pytest.raises(MemoryError, match="even at batch size 1"):
        cap.capture(model, tokens, META, {("resid_post", 0): tmp_path / "x.h5"}, opts,
                    inject_oom=inject, progress=False)  # fmt: skip
    assert not (tmp_path / "x.h5").exists()


def test_shards_merge_to_the_unsharded_bytes(model, tokens, tmp_path):
    opts = CaptureConfig(dtype="float32", batch_size=4, checkpoint_tokens=30)
    unit = cap.unit_contexts(opts, 12)
    ranges = [cap.shard_range(len(tokens), unit, i, 3) for i in range(3)]
    assert ranges[0][0] == 0 and ranges[-1][1] == 37
    assert all(
        a[1] == b[0] and a[1] % unit == 0 for a, b in zip(ranges[:-1], ranges[1:], strict=True)
    )
    shards = []
    for i, span in enumerate(ranges):
        path = tmp_path / f"shard{i}.h5"
        cap.capture(model, tokens, META, {("attn_out", 1): path}, opts, span, (i, 3),
                    progress=False)  # fmt: skip
        shards.append(path)
    merge_shards(shards, tmp_path / "merged.h5")
    whole = tmp_path / "whole.h5"
    cap.capture(model, tokens, META, {("attn_out", 1): whole}, opts, progress=False)
    with open_activations(tmp_path / "merged.h5") as m, open_activations(whole) as w:
        assert m["acts"][:].tobytes() == w["acts"][:].tobytes()
        assert m["tokens"][:].tobytes() == w["tokens"][:].tobytes()
        assert m.attrs["n_tokens"] == w.attrs["n_tokens"] and m.attrs["n_shards"] == 1
    with pytest.raises(ValueError, match="shards"):
        cap.shard_range(37, unit, 0, 100)


def _corrupt(path, how):
    with h5py.File(path, "r+") as f:
        if how == "incomplete":
            f.attrs["complete"] = False
        elif how == "n_tokens":
            f.attrs["n_tokens"] = int(f.attrs["n_tokens"]) + 1
        elif how == "hook":
            f.attrs["hook_name"] = "blocks.9.hook_resid_post"
        elif how == "missing":
            del f.attrs["token_set_hash"]


@pytest.mark.parametrize("how", ["incomplete", "n_tokens", "hook", "missing", "garbage"])
def test_reader_refuses_bad_files(model, tokens, tmp_path, how):
    targets, _ = run(model, tokens, tmp_path, layers=(0,), sites=("resid_post",))
    path = targets[("resid_post", 0)]
    if how == "garbage":
        path.write_bytes(b"not hdf5")
    else:
        _corrupt(path, how)
    with pytest.raises(ActivationFileError) as err:
        open_activations(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_partial_file_is_refused(model, tokens, tmp_path):
    """A capture stopped mid-way leaves only a .partial, which the reader will not take."""

    class Stop(Exception):
        pass

    calls = {"n": 0}

    def stop_after_two(batch_size):
        calls["n"] += 1
        if calls["n"] > 2:
            raise Stop

    opts = CaptureConfig(dtype="float32", batch_size=4, checkpoint_tokens=30)
    out = tmp_path / "layer_0.h5"
    with pytest.raises(Stop):
        cap.capture(model, tokens, META, {("resid_post", 0): out}, opts,
                    inject_oom=stop_after_two, progress=False)  # fmt: skip
    assert not out.exists() and partial_path(out).exists()
    with pytest.raises(ActivationFileError, match="incomplete"):
        open_activations(partial_path(out))
    # The rerun resumes from the last checkpoint and ends with the same bytes as a clean run.
    result = cap.capture(model, tokens, META, {("resid_post", 0): out}, opts, progress=False)
    assert result.resumed_from > 0
    clean = tmp_path / "clean.h5"
    cap.capture(model, tokens, META, {("resid_post", 0): clean}, opts, progress=False)
    with open_activations(out) as f, open_activations(clean) as g:
        assert f["acts"][:].tobytes() == g["acts"][:].tobytes()


def test_full_disk_is_refused_before_any_row_is_written(model, tokens, tmp_path, monkeypatch):
    """HDF5 can report a write that failed for want of space only as an ignored warning, so the
    stage checks the free space first (ENOSPC: one line and exit 4 through cli.main)."""
    import errno
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 20, 1 << 20, 4096))
    opts = CaptureConfig(dtype="float32", batch_size=4)
    target = {("resid_post", 0): tmp_path / "full.h5"}
    with pytest.raises(OSError, match="capture needs .* MiB more under") as info:
        cap.capture(model, tokens, META, target, opts, progress=False)
    assert info.value.errno == errno.ENOSPC
    assert not (tmp_path / "full.h5").exists()


def test_forward_passes_counted_per_context(model, tokens, tmp_path):
    """Layers 0 and 1 of 3: each context's pass stops after 2 blocks, 2/3 of a forward; the
    count goes into every file's attrs and survives a shard merge."""
    targets, result = run(model, tokens, tmp_path, layers=(0, 1), sites=("resid_post",))
    assert result.cost["forward_equivalents_per_prompt"] == pytest.approx(2 / 3)
    assert result.cost["forward_equivalents_total"] == pytest.approx(37 * 2 / 3)
    assert result.cost["forward_equivalents_unit"] == "context"
    with open_activations(targets[("resid_post", 1)]) as f:
        assert f.attrs["forward_equivalents_per_prompt"] == pytest.approx(2 / 3)
        assert json.loads(f.attrs["forward_equivalents_by_part"]) == {
            "capture": pytest.approx(2 / 3)
        }
    opts = CaptureConfig(dtype="float32", batch_size=4, checkpoint_tokens=30)
    unit = cap.unit_contexts(opts, 12)
    shards = []
    for i in range(2):
        path = tmp_path / f"shard{i}.h5"
        span = cap.shard_range(len(tokens), unit, i, 2)
        cap.capture(model, tokens, META, {("attn_out", 2): path}, opts, span, (i, 2),
                    progress=False)  # fmt: skip
        shards.append(path)
    merge_shards(shards, tmp_path / "merged.h5")
    with open_activations(tmp_path / "merged.h5") as m:
        assert m.attrs["forward_equivalents_per_prompt"] == pytest.approx(1.0)
        assert m.attrs["forward_equivalents_total"] == pytest.approx(37.0)
        assert json.loads(m.attrs["forward_equivalents_by_part"]) == {"capture": pytest.approx(1.0)}


def test_progress_never_runs_ahead_of_the_rows(model, tokens, tmp_path, monkeypatch):
    """The rows go to disk from a thread (writer.py): a checkpoint waits for its unit's rows,
    here behind a writer slowed down, so a kill after it resumes from rows that are there."""
    import time

    from circuitflow.capture import writer
    from circuitflow.capture.files import PartialFile

    write, checkpoint = writer.BatchWriter._write, PartialFile.checkpoint
    seen = []

    def slow_write(self, *args):
        time.sleep(0.02)
        write(self, *args)

    def checked(self, done, batch_size):
        rows = self.file["acts"][: done * 11]
        seen.append(int((np.abs(rows).sum(1) > 0).sum()) == len(rows))
        checkpoint(self, done, batch_size)

    monkeypatch.setattr(writer.BatchWriter, "_write", slow_write)
    monkeypatch.setattr(PartialFile, "checkpoint", checked)
    run(model, tokens, tmp_path, layers=(1,), sites=("resid_post",), batch_size=4)
    assert len(seen) > 3 and all(seen)


def test_sites_that_share_a_hook_each_get_their_file(tokens, tmp_path):
    """In a model without normalisation mlp_in is the residual stream the MLP reads as it is,
    resid_mid's hook: one hook then fills two files, each holding the MLP's own input."""
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=12, d_vocab=20,
        act_fn="gelu", normalization_type=None, seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg).eval()
    targets, _ = run(model, tokens, tmp_path, layers=(1,), sites=("mlp_in", "resid_mid"))
    seen = []
    model.blocks[1].mlp.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.inference_mode():
        model(torch.from_numpy(tokens.astype(np.int64)))
    want = seen[0][:, 1:].reshape(-1, 16).numpy()  # BOS left out (capture.exclude_bos)
    for site in ("mlp_in", "resid_mid"):
        with open_activations(targets[(site, 1)]) as f:
            assert f.attrs["hook_name"] == "blocks.1.hook_resid_mid"
            np.testing.assert_array_equal(f["acts"][:], want)
