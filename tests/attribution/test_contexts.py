"""contexts.top_contexts: the attribution stages' feature contexts are the features stage's top
contexts, checked against the model and SAE run again on the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.spliced import tiny_spliced, write_feature_dirs

from circuitflow.attribution.contexts import COLUMNS, top_contexts

N_CONTEXTS, SEED = 48, 1


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    model, saes, _ = tiny_spliced(2)
    dirs = write_feature_dirs(model, saes, tmp_path_factory.mktemp("ctx"), N_CONTEXTS, SEED)
    return model, saes, dirs


def test_top_contexts_are_the_features_stage_maxima(folders):
    model, saes, dirs = folders
    # The tokens write_feature_dirs fed, and every feature's activation there, computed again.
    tokens = torch.from_numpy(
        np.random.default_rng(SEED).integers(1, model.cfg.d_vocab, (N_CONTEXTS, model.cfg.n_ctx))
    )
    tokens[:, 0] = 0
    _, cache = model.run_with_cache(tokens, names_filter=list(saes))
    wanted = {("resid_post", 0): [0, 3, 5], ("resid_post", 1): [2]}
    found = top_contexts(dirs, wanted, n_contexts=3)
    assert list(found.columns) == COLUMNS
    assert {(r.site, r.layer, r.feature) for r in found.itertuples()} == {
        (s, la, f) for (s, la), fs in wanted.items() for f in fs
    }  # every wanted feature fires somewhere on random tokens; no other one is read
    for (site, layer, feature), g in found.groupby(["site", "layer", "feature"]):
        hook = f"blocks.{layer}.hook_{site}"
        with torch.no_grad():
            acts = saes[hook].encode(cache[hook])[..., feature][:, 1:]  # BOS left out
        best = torch.sort(acts.flatten(), descending=True).values[: len(g)].numpy()
        assert g["rank"].tolist() == list(range(1, len(g) + 1)) and len(g) == 3
        np.testing.assert_allclose(g["activation"], best, rtol=1e-5)
        for r in g.itertuples():
            assert r.row == r.context * (model.cfg.n_ctx - 1) + r.position - 1
            assert acts[r.context, r.position - 1] == pytest.approx(r.activation, rel=1e-5)
            assert str(int(tokens[r.context, r.position])) == r.max_token
            assert f" [[{r.max_token}]] " in r.text
            window = r.text.replace("[[", "").replace("]]", "").split()
            assert window == [str(t) for t in r.tokens]  # the window, the maximum marked


def test_nothing_asked_nothing_read(folders):
    _, _, dirs = folders
    assert top_contexts(dirs, {}, 4).empty
    assert top_contexts([], {("resid_post", 0): [1]}, 4).empty
    assert list(top_contexts(dirs, {("mlp_out", 0): [1]}, 4).columns) == COLUMNS
    one = top_contexts(dirs, {("resid_post", 1): [2]}, 1)
    assert len(one) == 1 and one["rank"].tolist() == [1]
