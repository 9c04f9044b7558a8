"""The features stage's pass on a tiny TransformerLens model with an SAE and a transcoder sharing
it: each collector equals one fed every context's features in a single batch (the reference),
a pass stopped by SIGTERM and resumed from its checkpoint equals an uninterrupted one, the
written `context` names token set rows; and which contexts the pass reads per sae.source."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

from circuitflow.features import plan, stage
from circuitflow.features.collect import Collector
from circuitflow.perf import PassCounter
from circuitflow.resumable import Interrupted

VOCAB, D, T, D_SAE, N = 40, 32, 10, 12, 48
FIELDS = ("count", "max", "hist", "top", "sample")


@pytest.fixture(scope="module")
def parts():
    from helpers.transcoders import random_transcoders
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=D, n_heads=4, d_head=8, d_mlp=64, d_vocab=VOCAB, n_ctx=T,
        act_fn="gelu", normalization_type="LN", seed=0, device="cpu",
    )  # fmt: skip
    model = HookedTransformer(cfg).eval()
    sae = StandardSAE(
        StandardSAEConfig(d_in=D, d_sae=D_SAE, device="cpu",
                          metadata=SAEMetadata(hook_name="blocks.1.hook_resid_post"))
    ).eval()  # fmt: skip
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(D, D_SAE, generator=torch.Generator().manual_seed(1)))
        sae.b_enc.fill_(-2.0)
    transcoder = random_transcoders(model, d_sae=D_SAE, k=3)[0]
    tokens = np.random.default_rng(0).integers(1, VOCAB, size=(N, T)).astype(np.int32)
    tokens[:, 0] = 0  # BOS
    return model, {"resid_post": (1, sae), "mlp_out": (0, transcoder)}, tokens


def members(parts, tmp_path) -> list[stage.Member]:
    _, dictionaries, _ = parts
    return [
        stage.Member(site, layer, d, tmp_path / site, tmp_path / "out" / site,
                     Collector(D_SAE, k=4, samples=2, seed=3, first_position=1))
        for site, (layer, d) in dictionaries.items()
    ]  # fmt: skip


ROWS = tuple(range(N - 1, -1, -1))  # fed in reverse: contexts are named by token set row


def reference(parts, member: stage.Member) -> Collector:
    """One batch of every context, in the order fed, encoded outside the stage."""
    model, _, tokens = parts
    ids = torch.from_numpy(tokens[list(ROWS)].astype(np.int64))
    _, cache = model.run_with_cache(ids, names_filter=[member.hook])
    ref = Collector(D_SAE, k=4, samples=2, seed=3, first_position=1)
    with torch.no_grad():
        ref.update(ids, member.sae.encode(cache[member.hook]))
    return ref


def same(a: Collector, b: Collector) -> None:
    assert a.n_contexts == b.n_contexts == N
    for name in FIELDS:
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6)


def test_the_pass_feeds_every_dictionary_of_the_group(parts, tmp_path):
    model, _, tokens = parts
    ms = members(parts, tmp_path)
    assert {m.kind for m in ms} == {"sae", "transcoder"}
    assert ms[1].hook == "blocks.0.ln2.hook_normalized"  # a transcoder reads the MLP's input
    counter = PassCounter()
    fed = stage.feed(model, ms, tokens, ROWS, 7, 0, None, counter, progress=False)
    assert fed == N and counter.total() == N  # through both layers of two: one pass a context
    for m in ms:
        assert m.collector.count.sum() > 0
        same(m.collector, reference(parts, m))


def test_a_stopped_pass_resumes_to_the_same_statistics(parts, tmp_path, monkeypatch):
    model, _, tokens = parts
    path = tmp_path / "ckpt" / stage.CHECKPOINT
    first = members(parts, tmp_path)
    calls = {"n": 0}
    update = Collector.update

    def sigterm_after_two_batches(self, *args):
        update(self, *args)
        calls["n"] += 1
        if calls["n"] == 2 * len(first):  # both members of the second batch
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Collector, "update", sigterm_after_two_batches)
    with pytest.raises(Interrupted, match="context 10 of 48"):
        stage.feed(model, first, tokens, ROWS, 5, 0, (path, "key", 100), PassCounter(), False)
    monkeypatch.setattr(Collector, "update", update)
    again = members(parts, tmp_path)
    assert stage.load_checkpoint(path, "other key", again) == 0  # other inputs: afresh
    damaged = path.with_name("damaged.pt")
    damaged.write_bytes(path.read_bytes()[:100])
    assert stage.load_checkpoint(damaged, "key", again) == 0  # a kill mid-write: afresh
    fed = stage.load_checkpoint(path, "key", again)
    assert fed == 10 and all(m.collector.n_contexts == 10 for m in again)
    stage.feed(model, again, tokens, ROWS, 8, fed, (path, "key", 100), PassCounter(), False)
    for m in again:
        same(m.collector, reference(parts, m))


def test_written_contexts_name_token_set_rows(parts, tmp_path):
    import pandas as pd

    model, _, tokens = parts
    ms = members(parts, tmp_path)
    counter = PassCounter()
    stage.feed(model, ms, tokens, ROWS, 16, 0, None, counter, progress=False)
    opts = stage.FeaturesConfig(k=4, samples=2, window=(3, 1), promoted_tokens=3)
    vocab = [f"t{i}" for i in range(VOCAB)]
    meta = {"site": "resid_post", "layer": 1, "hook": ms[0].hook}
    metas = [meta, {**meta, "site": "mlp_out", "layer": 0, "hook": ms[1].hook}]
    held = np.random.default_rng(1).integers(1, VOCAB, size=(6, T)).astype(np.int32)
    held[:, 0] = 0
    summaries = stage.read_out(model, ms, tokens, ROWS, vocab, opts, 1, metas, pass_total=N,
                               held=held, batch=4, seed=0)  # fmt: skip
    # One sweep for both: the windows' contexts through both layers once, shared; the held-out
    # pass, 6 contexts of 48, through both layers once.
    sweep = {s["forward_equivalents_by_part"]["windows"] for s in summaries}
    assert len(sweep) == 1 and 0 < sweep.pop() <= 0.5
    assert {s["forward_equivalents_by_part"]["held_out"] for s in summaries} == {6 / N / 2}
    ctx = pd.read_parquet(ms[0].out / "contexts.parquet")
    for row in ctx.itertuples():
        window = tokens[row.context, row.window_start : row.window_start + len(row.tokens)]
        np.testing.assert_array_equal(row.tokens, window)
    # Every labeller's labels scored on the held-out contexts' 6 x 9 counted positions.
    feats = pd.read_parquet(ms[0].out / "features.parquet")
    labels = summaries[0]["labels"]
    assert labels["held_out_tokens"] == 6 * (T - 1) and set(labels["labellers"]) == {
        "tokens",
        "rules",
    }
    live = ~feats["dead"]
    assert feats.loc[live, "label_f1"].between(0, 1).all()
    # tp + fn: the held-out positions where each feature fires, whatever its label says.
    ids = torch.from_numpy(held.astype(np.int64))
    _, cache = model.run_with_cache(ids, names_filter=[ms[0].hook])
    with torch.no_grad():
        fires = (ms[0].sae.encode(cache[ms[0].hook])[:, 1:] > 0).sum((0, 1)).numpy()
    np.testing.assert_array_equal(feats["label_tp"] + feats["label_fn"], fires)
    examples = pd.read_parquet(ms[0].out / "examples.parquet")
    for row in examples.itertuples():
        window = held[row.context, row.window_start : row.window_start + len(row.tokens)]
        np.testing.assert_array_equal(row.tokens, window)


@pytest.mark.parametrize(
    ("source", "held_out", "wanted", "rows", "n_held"),
    [
        ("stream", 3, 5, [7, 8, 9, 0, 1], 3),  # held-out evaluation contexts first
        ("stream", 3, 2, [7, 8], 2),
        ("pretrained", 0, 4, [0, 1, 2, 3], 4),  # published: none of ours trained on
        ("capture", 0, 20, list(range(10)), 0),  # every captured row trained on; capped
    ],
)
def test_the_pass_reads_untrained_contexts_first(source, held_out, wanted, rows, n_held):
    chosen = plan.contexts(source, 10, held_out, wanted)
    assert list(chosen.rows) == rows
    assert (chosen.held_out, chosen.trained_on) == (n_held, len(rows) - n_held)
