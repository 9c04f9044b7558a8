"""The feature browser on real feature files: the features stage's library (collector, windows,
logits, labels, write) run on the embedded default's architecture and language with a TopK SAE
on each layer's resid_post, then the page written from the folders and looked at in headless
Chromium: no JavaScript errors, sorting and search against pandas on the Parquet files, a card's
histogram, contexts (each token's shading against its activation in contexts.parquet) and logit
table, the anchors that open a card, and the index of every dictionary's page."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.chromium import browse, chromium
from helpers.dag import REPO
from helpers.dictionaries import build
from helpers.graph_page import check_page

from circuitflow.attribution.page import rounded
from circuitflow.features import labels, logits, write
from circuitflow.features.collect import Collector
from circuitflow.model.embedded import EmbeddedModelConfig, tl_config
from circuitflow.model.language import LanguageConfig, SyntheticLanguage
from circuitflow.nodes import Node, dictionary_page, hook_name
from circuitflow.report.features_page import (
    index_rows,
    site_layer_of,
    write_dictionary_page,
    write_index,
)

CHECKS_JS = (Path(__file__).parents[1] / "helpers" / "features_page_checks.js").read_text()
N_CONTEXTS, K, SAMPLES, N_TOP, N_PER_BAND = 96, 6, 2, 4, 1


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two dictionaries' feature folders (layers 0 and 1), written by features.write, and the
    browser of both: a page each (4 of the 6 top contexts, 1 of the 2 samples per band shown)
    and the index."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    lang = SyntheticLanguage(LanguageConfig())
    cfg = EmbeddedModelConfig()
    model_cfg = HookedTransformerConfig(**tl_config(cfg, lang.vocab_size), device="cpu")
    model = HookedTransformer(model_cfg).eval()
    contexts = lang.batch(np.random.default_rng(0), N_CONTEXTS, cfg.architecture.n_ctx)
    root = tmp_path_factory.mktemp("features_page")
    dirs = {}
    for layer in (0, 1):
        hook = hook_name("resid_post", layer)
        sae = build("topk", cfg.architecture.d_model, hook, seed=layer, k=4, n_dead=3)

        def read(ids, sae=sae, hook=hook):
            toks = torch.from_numpy(contexts[np.asarray(ids)])
            with torch.no_grad():
                _, cache = model.run_with_cache(toks, names_filter=[hook])
                return toks, sae.encode(cache[hook])

        col = Collector(sae.cfg.d_sae, k=K, samples=SAMPLES, first_position=1)
        for s in range(0, N_CONTEXTS, 32):
            col.update(*read(np.arange(s, s + 32)))
        feats, ctx, summary = write.build(
            col.result(), logits.top_logits(sae, model, k=5), read, lang.words, first_position=1,
            meta={"site": "resid_post", "layer": layer, "hook": hook, "dictionary": "sae"},
        )  # fmt: skip
        given_scores(feats, layer)
        folder = write.feature_dir(root, "resid_post", layer)
        dirs[("resid_post", layer)] = write.write(folder, feats, ctx, summary)
    index = root / "report" / "features.html"
    pages = {
        key: write_dictionary_page(folder, index.parent / dictionary_page(*key), N_TOP, N_PER_BAND)
        for key, folder in dirs.items()
    }
    write_index(list(dirs.values()), index)
    return SimpleNamespace(
        root=root,
        dirs=dirs,
        pages=pages,
        index=index,
        feats={k: pd.read_parquet(d / "features.parquet") for k, d in dirs.items()},
        ctx={k: pd.read_parquet(d / "contexts.parquet") for k, d in dirs.items()},
    )


def given_scores(feats: pd.DataFrame, seed: int) -> None:
    """Held-out counts for the page to show (the stage counts them: tests/features/
    test_stage.py), and what features/scores.py makes of them; half the labels weak."""
    from circuitflow.features.scores import Scores

    rng = np.random.default_rng(seed)
    n = len(feats)
    s = Scores(rng.integers(0, 40, n), rng.integers(0, 40, n), rng.integers(1, 40, n))
    for col, values in (("tp", s.tp), ("fp", s.fp), ("fn", s.fn), ("precision", s.precision),
                        ("recall", s.recall), ("f1", s.f1)):  # fmt: skip
        feats[f"label_{col}"] = values
    feats["label_control_f1"] = rng.random(n) / 20


def shown_label(row) -> str:
    return labels.shown(row["label"], float(row["label_f1"]))


def four(x: float) -> float:
    """The page's rounding of activations and densities: 4 significant digits."""
    return float(f"{x:.4g}")


def shown_contexts(ctx: pd.DataFrame, feature: int) -> pd.DataFrame:
    """The contexts a card shows, in its order: the top N_TOP by rank, then each band's first
    N_PER_BAND samples, strongest band first."""
    mine = ctx[ctx["feature"] == feature]
    top = mine[(mine["kind"] == "top") & (mine["rank"] < N_TOP)].sort_values("rank")
    bands = mine[(mine["kind"] == "quantile") & (mine["rank"] < N_PER_BAND)]
    return pd.concat([top, bands.sort_values(["band", "rank"], ascending=[False, True])])


def sorted_by(feats: pd.DataFrame, column: str, descending: bool) -> list[int]:
    """Feature indices by the rounded column (as the page holds it), ties by index."""
    key = feats[column].map(four)
    order = feats.assign(key=-key if descending else key).sort_values(["key", "feature"])
    return order["feature"].tolist()


def token_matches(feats: pd.DataFrame, ctx: pd.DataFrame, token: str) -> list[int]:
    """Features that fire on `token` in a shown top context, or promote it (trimmed, any case)."""
    key = token.strip().lower()
    top = ctx[(ctx["kind"] == "top") & (ctx["rank"] < N_TOP)]
    fires = {
        int(r.feature)
        for r in top.itertuples()
        if r.token_str[r.qualifying_index].strip().lower() == key
    }
    promotes = {
        int(f)
        for f, strs in zip(feats["feature"], feats["promoted_str"], strict=True)
        if key in [s.strip().lower() for s in strs]
    }
    return sorted(fires | promotes)


def page_data(page: Path) -> dict:
    return json.loads(re.search(r'id="feature-data">(.*?)</script>', page.read_text(), re.S)[1])


def test_each_page_is_self_contained_with_its_own_dictionary(run):
    words = SyntheticLanguage(LanguageConfig()).words
    for (site, layer), page in run.pages.items():
        text = page.read_text()
        assert "<script src" not in text and "<link" not in text
        assert "https://" not in text
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        data = page_data(page)
        d, feats = data["dictionary"], run.feats[(site, layer)]
        # Its own dictionary's features, and no other's.
        assert (d["key"], d["site"], d["layer"]) == (f"{site}.{layer}", site, layer)
        assert d["features"]["feature"] == feats["feature"].tolist()
        assert d["features"]["label"] == [shown_label(r) for _, r in feats.iterrows()]
        assert d["features"]["f1"] == [four(x) for x in feats["label_f1"]]
        assert d["summary"]["n_dead"] == int(feats["dead"].sum()) >= 3  # 3 never fire
        assert d["meta"] == {"hook": hook_name("resid_post", layer), "dictionary": "sae"}
        shown = [len(c) for c in d["features"]["contexts"]]
        ctx = run.ctx[(site, layer)]
        expected = [len(shown_contexts(ctx, f)) for f in feats["feature"]]
        assert shown == expected and max(shown) > N_TOP  # quantile samples shown too
        assert all(data["vocab"][i] == words[int(i)] for i in data["vocab"])
        # Its link back to the index.
        assert (page.parent / data["index"]).resolve() == run.index.resolve()
    labels = [tuple(page_data(p)["dictionary"]["features"]["label"]) for p in run.pages.values()]
    assert labels[0] != labels[1]


def test_index_lists_every_dictionary_and_links_its_page(run):
    text = run.index.read_text()
    rows = re.findall(r'<tr id="([^"]+)" data-dictionary="[^"]+"><td><a href="([^"]+)">', text)
    assert [key for key, _ in rows] == ["resid_post.0", "resid_post.1"]
    for (key, href), ((site, layer), page) in zip(rows, run.pages.items(), strict=True):
        assert key == f"{site}.{layer}"
        assert (run.index.parent / href).resolve() == page.resolve()
    table = index_rows(list(run.dirs.values()))
    for r, ((site, layer), folder) in zip(table.itertuples(), run.dirs.items(), strict=True):
        summary = json.loads((folder / "summary.json").read_text())
        feats = run.feats[(site, layer)]
        assert (r.site, r.layer, r.kind) == (site, layer, "sae")
        assert r.n_features == len(feats) and r.n_tokens == summary["n_tokens"]
        assert r.dead_fraction == pytest.approx(feats["dead"].mean())
        assert r.dense_fraction == pytest.approx(feats["dense"].mean())
        assert f"<td class='num'>{100 * float(f'{r.dead_fraction:.3g}'):.3g}%</td>" in text
    with pytest.raises(ValueError, match="given twice"):
        index_rows([run.dirs[("resid_post", 0)]] * 2)


def test_index_sends_an_old_address_on_to_its_card(run, tmp_path):
    """`features.html#resid_post.0.fN` (the single page's address) lands on feature N's card on
    resid_post layer 0's page."""
    feature = live_feature(run, 0)
    anchor = Node("feature", 0, feature, "resid_post").anchor
    done = browse(chromium(), run.index, "--dump-dom", fragment=anchor)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "<title>Features of resid_post layer 0</title>" in done.stdout
    assert f'data-anchor="{anchor}"' in done.stdout and f'data-feature="{feature}"' in done.stdout


def live_feature(run, layer: int) -> int:
    """A live feature of `layer` with quantile samples in at least two bands."""
    ctx = run.ctx[("resid_post", layer)]
    q = ctx[ctx["kind"] == "quantile"].groupby("feature")["band"].nunique()
    return int(q[q >= 2].index[0])


def test_browser_in_chromium(run, tmp_path):
    feats, ctx = run.feats[("resid_post", 1)], run.ctx[("resid_post", 1)]
    feature = live_feature(run, 1)
    row = feats.set_index("feature").loc[feature]
    top0 = ctx[(ctx["feature"] == feature) & (ctx["kind"] == "top") & (ctx["rank"] == 0)].iloc[0]
    token = top0["token_str"][top0["qualifying_index"]]
    fragment = row["label"].split('"')[1]  # the first token its label names
    shown = feats.assign(label=[shown_label(r) for _, r in feats.iterrows()])
    other = live_feature(run, 0)
    clicked = int(feats["feature"][(feats["feature"] != feature) & ~feats["dead"]].iloc[0])
    found = check_page(
        chromium(), run.pages[("resid_post", 1)], tmp_path, CHECKS_JS,
        fragment=Node("feature", 1, feature, "resid_post").anchor,
        sorts=[["density", True], ["max", True], ["mean", False], ["density", False],
               ["f1", True]],
        header="max",
        searches=[["index", str(feature)], ["index", f"f{clicked}"], ["label", fragment],
                  ["token", f" {token.upper()} "], ["any", "dead"], ["token", "no such"]],
        click=clicked, follow=Node("feature", 0, other, "resid_post").anchor,
    )  # fmt: skip
    assert found["errors"] == []
    # The address opened the feature's card.
    card = found["opened"]
    assert not card["hidden"] and card["feature"] == feature
    assert card["anchor"] == f"resid_post.1.f{feature}" and card["label"] == shown_label(row)
    # How far to trust it: the F1 and the counts behind it, beside the control.
    predicted, firing = row["label_tp"] + row["label_fp"], row["label_tp"] + row["label_fn"]
    assert f"F1 {rounded(float(row['label_f1']))} on " in card["text"]
    assert f"fires on {row['label_tp']} of the {predicted} tokens" in card["text"]
    assert f"names {row['label_tp']} of the {firing} tokens" in card["text"]
    assert f"density {rounded(float(row['density']))} ({row['count']} of " in card["text"]
    # The histogram: one bar per bin from the first to the last with tokens, as in the Parquet.
    hist = np.asarray(row["hist"])
    nz = np.flatnonzero(hist)
    assert [b for b, _, _ in card["hist"]] == list(range(nz[0], nz[-1] + 1))
    assert [c for _, c, _ in card["hist"]] == hist[nz[0] : nz[-1] + 1].tolist()
    counts, heights = hist[nz[0] : nz[-1] + 1], np.array([h for _, _, h in card["hist"]])
    assert ((heights == 0) == (counts == 0)).all()
    tall = heights > 1  # bars drawn at their height (the smallest are kept visible at 1 px)
    np.testing.assert_allclose(heights[tall] / heights.max(), counts[tall] / counts.max())
    # The contexts: the shown windows in order, every token's value and shading from the Parquet.
    expected = shown_contexts(ctx, feature)
    assert len(card["contexts"]) == len(expected) > N_TOP
    for got, r in zip(card["contexts"], expected.itertuples(), strict=True):
        assert got["band"] == r.band and got["peak"] == r.qualifying_index
        assert got["tokens"] == list(r.token_str)
        np.testing.assert_allclose(got["values"], r.values, rtol=1e-3, atol=1e-6)
        np.testing.assert_allclose(got["activation"], r.activation, rtol=1e-3)
        shade = np.clip(np.asarray(r.values) / row["max_activation"], 0, 1)
        np.testing.assert_allclose(got["alphas"], shade, atol=3e-3)
    assert max(max(c["alphas"]) for c in card["contexts"]) > 0.99  # the top token, fully shaded
    # The logit table: promoted and suppressed tokens in order.
    assert [r[0] for r in card["logits"]] == list(row["promoted_str"])
    assert [r[2] for r in card["logits"]] == list(row["suppressed_str"])
    assert card["logits"][0][1] == f"+{rounded(float(row['promoted_values'][0]))}"
    # The table: every feature by index, then each sort against pandas.
    assert found["initial"] == feats["feature"].tolist()
    for got, (col, desc) in zip(found["sorted"], [("density", True), ("max_activation", True),
                                                   ("mean_activation", False),
                                                   ("density", False), ("label_f1", True)],
                                strict=True):  # fmt: skip
        assert got == sorted_by(feats, col, desc), col
    assert found["sorted"][0] != found["initial"]
    header = found["header"]
    assert header["sort"] == "max" and header["descending"] is True
    assert header["rows"] == sorted_by(feats, "max_activation", True)
    # Search by index, label and token (and anything: "dead" is the dead features' label).
    by_index, by_f, by_label, by_token, by_any, nothing = found["searches"]
    assert by_index == [feature] and by_f == [clicked]
    labelled = shown["feature"][shown["label"].str.lower().str.contains(fragment.lower())]
    assert by_label == labelled.tolist() and feature in by_label
    assert by_token == token_matches(feats, ctx, token) and feature in by_token
    assert len(by_token) < len(feats)
    assert by_any == feats["feature"][feats["dead"]].tolist() and nothing == []
    # A click on a row sets the address and opens that card; an anchor into the other
    # dictionary says it is not on this page and links the index, which sends it on.
    assert found["clicked"]["hash"] == f"#resid_post.1.f{clicked}"
    assert found["clicked"]["card"]["feature"] == clicked and found["clicked"]["selected"] == [
        clicked
    ]
    followed = found["followed"]
    assert (
        followed["card"]["feature"] is None
        and followed["card"]["anchor"] == f"resid_post.0.f{other}"
    )
    assert followed["elsewhere"] == f"../../features.html#resid_post.0.f{other}"
    assert followed["rows"] == len(feats)  # the table still this page's dictionary


def test_anchor_is_the_nodes_one():
    assert Node("feature", 1, 355, "resid_post").anchor == "resid_post.1.f355"
    with pytest.raises(ValueError, match="only a feature"):
        Node("head", 1, 2).anchor  # noqa: B018


def test_command_line_and_bad_input(run, tmp_path):
    folders = [str(d) for d in run.dirs.values()]
    out = tmp_path / "features" / "resid_post" / "layer_1.html"
    script = [sys.executable, str(REPO / "scripts" / "report.py")]
    done = subprocess.run([*script, "features", "--features-dir", folders[1], "--out-html",
                           str(out), "--n-top", "2"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    d = page_data(out)["dictionary"]
    assert d["key"] == "resid_post.1"
    assert max(sum(c[0] < 0 for c in cs) for cs in d["features"]["contexts"]) == 2
    index = tmp_path / "features.html"
    done = subprocess.run([*script, "features_index", "--features-dirs", *folders, "--out-html",
                           str(index)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert index.read_text().count('data-dictionary="resid_post.') == 2
    assert site_layer_of(run.dirs[("resid_post", 1)]) == ("resid_post", 1)
    broken = tmp_path / "features" / "resid_post" / "layer_3"
    broken.mkdir(parents=True)
    (broken / "summary.json").write_text("{}")
    done = subprocess.run([*script, "features", "--features-dir", str(broken), "--out-html",
                           str(out)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {broken}: missing features.parquet, contexts.parquet (the features stage's files)"
    )
    done = subprocess.run([*script, "features_index", "--features-dirs", str(broken),
                           "--out-html", str(index)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {broken / 'summary.json'}: missing n_features, n_tokens")
    )
    with pytest.raises(ValueError, match="not a features/"):
        site_layer_of(tmp_path)


def test_a_published_dictionarys_features_link_their_neuronpedia_pages(run, tmp_path):
    """A dictionary whose summary.json names its Neuronpedia id (a published one's): its page
    holds where its features' Neuronpedia pages are, and each card links its own."""
    import shutil

    folder = tmp_path / "features" / "resid_post" / "layer_0"
    shutil.copytree(run.dirs[("resid_post", 0)], folder)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps(summary | {"neuronpedia_id": "m/0-res"}))
    page = write_dictionary_page(folder, tmp_path / "page.html", N_TOP, N_PER_BAND)
    assert page_data(page)["dictionary"]["neuronpedia"] == "https://www.neuronpedia.org/m/0-res/"
    assert page_data(run.pages[("resid_post", 0)])["dictionary"]["neuronpedia"] is None
    js = page.read_text()
    assert "d.neuronpedia + f.feature[i]" in js  # the card's link: the pages, then its index
