"""A hand-built feature on a tiny TransformerLens model: latent 0 of a SAELens SAE reads one
token's embedding direction and writes that token's unembedding direction, so its top contexts,
promoted token and label must all name that token; then the files and Neuronpedia's batches
read back with their documented fields."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from circuitflow.features import labels, logits, neuronpedia, write
from circuitflow.features.collect import Collector

VOCAB, D, T, D_SAE, TOK = 40, 32, 10, 6, 7
HOOK = "blocks.0.hook_resid_pre"
VOCAB_STR = [f"t{i}" for i in range(VOCAB)]
# The keys, in order, of SAEDashboard's feature and activation records (`to_dict` of
# NeuronpediaDashboardFeature and NeuronpediaDashboardActivation, sae_dashboard/neuronpedia/
# neuronpedia_dashboard.py at db4839a, version 0.8.0), copied here as the reference.
SAEDASHBOARD_FEATURE = """feature_index neuron_alignment_indices neuron_alignment_values
neuron_alignment_l1 correlated_neurons_indices correlated_neurons_l1 correlated_neurons_pearson
correlated_features_indices correlated_features_l1 correlated_features_pearson neg_str
neg_values pos_str pos_values frac_nonzero freq_hist_data_bar_values freq_hist_data_bar_heights
logits_hist_data_bar_heights logits_hist_data_bar_values n_prompts_total n_tokens_in_prompt
dataset decoder_weights_dist activations vector""".split()
SAEDASHBOARD_ACTIVATION = (
    "bin_min bin_max bin_contains tokens values qualifying_token_index".split()
)


@pytest.fixture(scope="module")
def setup():
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=1, d_model=D, n_heads=4, d_head=8, d_mlp=64, d_vocab=VOCAB, n_ctx=T,
        act_fn="gelu", normalization_type="LN", seed=0, device="cpu",
    )  # fmt: skip
    model = HookedTransformer(cfg).eval()
    sae = StandardSAE(
        StandardSAEConfig(d_in=D, d_sae=D_SAE, metadata=SAEMetadata(hook_name=HOOK), device="cpu")
    ).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.W_E[TOK] *= 4  # the token's embedding dominates its residual
        model.ln_final.w.copy_(1 + 0.3 * torch.randn(D, generator=g))  # an unfolded scale
        e = model.W_E[TOK] / model.W_E[TOK].norm()
        sae.b_dec.zero_()
        sae.W_enc.copy_(torch.randn(D, D_SAE, generator=g) / D**0.5)
        sae.b_enc.copy_(torch.full((D_SAE,), -0.2))
        sae.W_enc[:, 0] = e
        sae.b_enc[0] = -0.5 * model.W_E[TOK].norm()
        u = model.W_U[:, TOK]
        sae.W_dec[0] = u / u.norm()
    rng = np.random.default_rng(0)
    contexts = rng.integers(0, VOCAB, size=(64, T))
    contexts[contexts == TOK] = TOK + 1
    contexts[rng.integers(0, 64, 12), rng.integers(1, T, 12)] = TOK  # planted, never at 0

    def read(ids):
        toks = torch.from_numpy(contexts[np.asarray(ids)])
        with torch.no_grad():
            _, cache = model.run_with_cache(toks, names_filter=[HOOK], stop_at_layer=1)
            return toks, sae.encode(cache[HOOK])

    return model, sae, contexts, read


@pytest.fixture(scope="module")
def built(setup, tmp_path_factory):
    model, sae, contexts, read = setup
    col = Collector(D_SAE, k=5, samples=2, first_position=1)
    for s in range(0, len(contexts), 16):
        col.update(*read(np.arange(s, min(s + 16, len(contexts)))))
    feats, ctx, summary = write.build(
        col.result(), logits.top_logits(sae, model, k=5), read, VOCAB_STR, first_position=1,
        meta={"site": "resid_pre", "layer": 0, "hook": HOOK},
    )  # fmt: skip
    folder = write.write(
        write.feature_dir(tmp_path_factory.mktemp("run"), "resid_pre", 0), feats, ctx, summary
    )
    return feats, ctx, summary, folder


def test_hand_built_feature_names_its_token(built):
    feats, ctx, _, _ = built
    top = ctx[(ctx["feature"] == 0) & (ctx["kind"] == "top")].sort_values("rank")
    assert len(top) == 5
    assert all(w[q] == "t7" for w, q in zip(top["token_str"], top["qualifying_index"], strict=True))
    assert (np.diff(top["activation"]) <= 0).all()
    row = feats.set_index("feature").loc[0]
    assert row["promoted_ids"][0] == TOK and row["promoted_str"][0] == "t7"
    assert row["label"].startswith('fires on "t7"') and 'promotes "t7"' in row["label"]
    assert row["count"] >= 5


def test_logit_effects_fold_the_final_norm(setup):
    """Against a hand computation: centre over d_model, scale by ln_final.w, unembed, centre
    over the vocabulary; and against TransformerLens's own folding."""
    model, sae, _, _ = setup
    w_dec = sae.W_dec.detach().double().numpy()
    d = w_dec - w_dec.mean(1, keepdims=True)
    ref = d @ (
        model.ln_final.w.detach().double().numpy()[:, None] * model.W_U.detach().double().numpy()
    )
    ref -= ref.mean(1, keepdims=True)
    got = logits.top_logits(sae, model, k=VOCAB)
    np.testing.assert_allclose(got.top_values, np.sort(ref, 1)[:, ::-1], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got.top_ids[:, 0], ref.argmax(1))
    np.testing.assert_array_equal(got.bottom_ids[:, 0], ref.argmin(1))
    assert got.hist.sum(1).tolist() == [VOCAB] * D_SAE
    from transformer_lens import HookedTransformer

    folded = HookedTransformer(model.cfg)
    folded.load_and_process_state_dict(
        model.state_dict(), fold_ln=True, center_writing_weights=False
    )
    assert folded.cfg.normalization_type == "LNPre"
    np.testing.assert_allclose(
        logits.top_logits(sae, folded, k=VOCAB).top_values, got.top_values, rtol=1e-4, atol=1e-5
    )


def test_the_tokens_labeller_names_the_heaviest_tokens():
    """Feature 0's top entries name tokens a, b, b, c with activations 3, 1, 1, 2.5: b's sum (2)
    and c's (2.5) lose to a's (3) and c's; feature 1 has no top entry (dead)."""
    table = labels.token_rules(np.zeros(4, int), np.array([0, 1, 1, 2]),
                               np.array([3.0, 1.0, 1.0, 2.5]), 2)  # fmt: skip
    got = labels.texts(table, ["a", "b", "c"], [""], ["x", "y"])
    assert got == ['fires on "a" / "c"; promotes "x"', "dead"]
    tie = labels.token_rules(np.zeros(3, int), np.array([2, 1, 0]), np.ones(3), 1)
    assert tie.atoms[0].tolist()[:1] == [2]  # a tie goes to the earlier in rank


def documented(doc: str) -> set[str]:
    """The names a docstring's list items define (before their colon)."""
    items = [line[2:].split(":")[0] for line in doc.splitlines() if line.startswith("- `")]
    return {name for item in items for name in item.split("`")[1::2]}


def documented_keys(doc: str) -> list[str]:
    """The backticked names of the summary's paragraph, up to `meta`."""
    return [n for n in doc.split("`meta`")[0].split("`")[1::2] if n.isidentifier()]


def test_files_have_their_documented_columns(built):
    _, _, _, folder = built
    feats = pd.read_parquet(folder / "features.parquet")
    ctx = pd.read_parquet(folder / "contexts.parquet")
    summary = json.loads((folder / "summary.json").read_text())
    assert folder.parts[-3:] == ("features", "resid_pre", "layer_0")
    doc_feats, doc_ctx = write.__doc__.split("`summary.json`:")[0].split("`contexts.parquet`")
    assert set(feats.columns) == documented(doc_feats)
    assert set(ctx.columns) == documented(doc_ctx)
    for key in documented_keys(write.__doc__.split("`summary.json`:")[1]):
        assert key in summary, key
    assert len(feats) == D_SAE and feats["hist"].map(len).eq(62).all()
    assert summary["n_tokens"] == 64 * (T - 1) and summary["hist_edges"][-1] is None
    assert summary["dead"] == feats.index[feats["dead"]].tolist()
    assert (ctx["tokens"].map(len) == ctx["values"].map(len)).all()
    row = ctx.iloc[0]
    assert row["values"][row["qualifying_index"]] == row["activation"]


def test_neuronpedia_batches_read_back(built, tmp_path):
    feats, ctx, summary, _ = built
    target = neuronpedia.Target("tiny", 0, "cf-res", HOOK, dataset="tokens.npy")
    out = neuronpedia.write_batches(tmp_path, feats, ctx, summary, target, n_features_per_batch=4)
    assert out.name == f"tiny_cf-res_{HOOK}_{D_SAE}"
    batches = sorted(out.glob("batch-*.json"))
    assert [b.name for b in batches] == ["batch-0.json", "batch-1.json"]
    got = []
    for path in batches:
        batch = json.loads(path.read_text())
        assert set(batch) == {"model_id", "layer", "sae_set", "sae_id_suffix", "features"}
        assert (batch["model_id"], batch["layer"], batch["sae_set"]) == ("tiny", 0, "cf-res")
        for f in batch["features"]:
            assert list(f) == SAEDASHBOARD_FEATURE
            for a in f["activations"]:
                assert list(a) == SAEDASHBOARD_ACTIVATION
                assert len(a["tokens"]) == len(a["values"])
            got.append(f)
    assert [f["feature_index"] for f in got] == list(range(D_SAE))
    f0 = got[0]
    assert f0["pos_str"][0] == "t7" and f0["frac_nonzero"] == pytest.approx(feats["density"][0])
    top = [a for a in f0["activations"] if a["bin_min"] == -1]
    assert len(top) == 5 and all(a["tokens"][a["qualifying_token_index"]] == "t7" for a in top)
    assert top[0]["values"][top[0]["qualifying_token_index"]] == pytest.approx(
        top[0]["bin_max"], abs=1e-4
    )
    bands = [a for a in f0["activations"] if a["bin_min"] != -1]
    # SAEDashboard's order: the top group, then the bands from the highest down.
    assert [a["bin_min"] == -1 for a in f0["activations"]] == [True] * 5 + [False] * len(bands)
    assert [a["bin_min"] for a in bands] == sorted((a["bin_min"] for a in bands), reverse=True)
    assert len({a["bin_min"] for a in bands}) > 1
    assert all(
        a["bin_min"] <= a["values"][a["qualifying_token_index"]] < a["bin_max"] + 1e-4
        for a in bands
    )
    assert sum(f0["freq_hist_data_bar_heights"]) == feats["count"][0]
    skipped = json.loads((out / "skipped_indexes.json").read_text())
    assert skipped["skipped_indexes"] == [] and skipped["layer"] == "0"
    assert f0["dataset"] == "tokens.npy" and f0["n_tokens_in_prompt"] == T
    assert f0["n_prompts_total"] == 64 and target.feature_id(3) == "tiny@0-cf-res:3"
    assert neuronpedia.feature_id("gpt2-small", 6, "res-jb", 355) == "gpt2-small@6-res-jb:355"


def test_a_transcoder_is_read_like_an_sae(setup):
    """A transcoder's decoder writes the MLP's output, the residual stream's space: its W_dec
    [d_sae, d_model] goes through the same read as an SAE's."""
    from helpers.transcoders import random_transcoders

    model, _, _, _ = setup
    tc = random_transcoders(model, d_sae=D_SAE)[0]
    assert tuple(tc.W_dec.shape) == (D_SAE, D)
    got = logits.top_logits(tc, model, k=3)
    ref = logits.top_logits(tc.W_dec.detach().clone(), model, k=3)
    np.testing.assert_array_equal(got.top_ids, ref.top_ids)
    np.testing.assert_array_equal(got.bottom_values, ref.bottom_values)


def test_the_export_command_writes_every_dictionary_of_a_run(built, tmp_path):
    """scripts/neuronpedia_export.py over a run's features/ folder: one runner folder per
    dictionary, its batches read back with SAEDashboard's fields and our numbers."""
    import subprocess
    import sys
    from pathlib import Path

    _, _, summary, folder = built
    results = folder.parents[2]
    script = Path(__file__).resolve().parents[2] / "scripts" / "neuronpedia_export.py"
    done = subprocess.run(
        [sys.executable, str(script), "--results", str(results), "--out", str(tmp_path),
         "--model-id", "tiny", "--features-per-batch", "5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (out,) = tmp_path.iterdir()
    assert out.name == f"tiny_circuitflow-resid_pre_{HOOK}_{D_SAE}"
    settings = json.loads((out / "run_settings.json").read_text())
    assert settings["hook_name"] == HOOK and settings["n_prompts_total"] == summary["n_contexts"]
    feats = pd.read_parquet(folder / "features.parquet")
    got = [
        f for b in sorted(out.glob("batch-*.json")) for f in json.loads(b.read_text())["features"]
    ]
    assert [f["feature_index"] for f in got] == feats["feature"].tolist()
    for f, row in zip(got, feats.itertuples(), strict=True):
        assert list(f) == SAEDASHBOARD_FEATURE
        assert f["pos_str"] == list(row.promoted_str)
        assert f["frac_nonzero"] == pytest.approx(row.density, abs=1e-8)
        assert all(list(a) == SAEDASHBOARD_ACTIVATION for a in f["activations"])
    missing = subprocess.run(
        [sys.executable, str(script), "--results", str(tmp_path / "none"), "--model-id", "x"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2 and "no feature folders" in missing.stderr
    zero = subprocess.run(
        [sys.executable, str(script), "--results", str(results), "--features-per-batch", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert zero.returncode == 2
    assert (
        zero.stderr.strip()
        .splitlines()[-1]
        .endswith("error: argument --features-per-batch: 0 is below 1")
    )
