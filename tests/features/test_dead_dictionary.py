"""A dead dictionary (no latent fires on any context): the features stage's read-out writes
every feature `dead`, summary dead_fraction 1.0 and a `dead_dictionary` note, no crash."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import torch

from circuitflow.features import stage
from circuitflow.features.collect import Collector
from circuitflow.perf import PassCounter

VOCAB, D, T, D_SAE, N = 40, 32, 10, 12, 24
ROWS = tuple(range(N))


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
    transcoder = random_transcoders(model, d_sae=D_SAE, k=3)[0]
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(D, D_SAE, generator=torch.Generator().manual_seed(1)))
        sae.b_enc.fill_(-1e4)  # no pre-activation reaches 0
        transcoder.b_enc.fill_(-1e4)  # TopK keeps 3, all <= 0: nothing fires
    tokens = np.random.default_rng(0).integers(1, VOCAB, size=(N, T)).astype(np.int32)
    tokens[:, 0] = 0
    return model, {"resid_post": (1, sae), "mlp_out": (0, transcoder)}, tokens


@pytest.fixture(scope="module")
def written(parts, tmp_path_factory):
    """The read-out of both dead dictionaries into features/{site}/layer_{layer}."""
    model, dictionaries, tokens = parts
    root = tmp_path_factory.mktemp("dead")
    ms = [
        stage.Member(site, layer, d, root / site, root / "features" / site / f"layer_{layer}",
                     Collector(D_SAE, k=4, samples=2, seed=3, first_position=1))
        for site, (layer, d) in dictionaries.items()
    ]  # fmt: skip
    stage.feed(model, ms, tokens, ROWS, 8, 0, None, PassCounter(), progress=False)
    opts = stage.FeaturesConfig(k=4, samples=2, window=(3, 1), promoted_tokens=3)
    vocab = [f"t{i}" for i in range(VOCAB)]
    metas = [{"site": m.site, "layer": m.layer, "hook": m.hook} for m in ms]
    held = np.random.default_rng(1).integers(1, VOCAB, size=(6, T)).astype(np.int32)
    held[:, 0] = 0
    logged = Logged()
    logging.getLogger(stage.__name__).addHandler(logged)
    try:
        summaries = stage.read_out(model, ms, tokens, ROWS, vocab, opts, 1, metas, pass_total=N,
                                   held=held, batch=4, seed=0)  # fmt: skip
    finally:
        logging.getLogger(stage.__name__).removeHandler(logged)
    return ms, summaries, logged.lines


class Logged(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_a_dead_dictionary_is_written_all_dead(written):
    ms, summaries, lines = written
    dead = [line for line in lines if "dead dictionary" in line]
    assert len(dead) == 2 and "none of its 12 latents fired on 24 contexts" in dead[0]
    for m, s in zip(ms, summaries, strict=True):
        feats = pd.read_parquet(m.out / "features.parquet")
        assert len(feats) == D_SAE and feats["dead"].all()
        assert pd.read_parquet(m.out / "contexts.parquet").empty
        assert s["dead_fraction"] == 1.0 and s["labels"]["labellers"]["rules"]["n_live"] == 0


def test_the_pages_and_export_of_a_dead_dictionary(written, tmp_path):

    from circuitflow.features import neuronpedia
    from circuitflow.report import features_page

    ms, _, _ = written
    folders = [m.out for m in ms]
    page = features_page.write_dictionary_page(folders[0], tmp_path / "page.html", 3, 2)
    index = features_page.write_index(folders, tmp_path / "i.html")
    feats, ctx, summary = features_page._read(folders[0])
    target = neuronpedia.Target("tiny", 1, "cf-res", summary["hook"], dataset="tokens.npy")
    out = neuronpedia.write_batches(tmp_path / "np", feats, ctx, summary, target)
    for html in (page, index):
        assert "NaN" not in html.read_text()
    assert "100" in index.read_text()  # the dead fraction, 100%
    for b in out.glob("batch-*.json"):
        assert "NaN" not in b.read_text()


def test_the_explainer_passes_a_dead_dictionary_through(written, tmp_path):
    """No live feature: nothing to explain, so no language model is called (None here), and
    the folder is written again with every feature's explanation `dead`."""
    from circuitflow.features import explainer
    from circuitflow.features.config import ExplainerConfig

    ms, _, _ = written
    config = {"seed": 0, "features": {"labeller": "some/explainer"}}
    out = tmp_path / "resid_post" / "layer_1"
    summary = explainer.explain_folder(None, None, ms[0].out, out, config, ExplainerConfig(),
                                       {}, None, None, False)  # fmt: skip
    block = summary["labels"]["labellers"]["explainer"]
    assert block["n_live"] == 0 and block["mean_f1"] is None
    feats = pd.read_parquet(out / "features.parquet")
    assert (feats["label_explainer"] == "dead").all()
