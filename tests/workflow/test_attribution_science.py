"""Attribution on the embedded default (the whole DAG, `default_results`): the circuits the
synthetic language plants are found, and the fast method agrees with exact patching."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers.attention import attention_scores
from helpers.schemas import check_graph_schema

from circuitflow.model.load import load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outputs(default_results):
    model = load_model(default_results / "model", "cpu", "float32")
    return default_results, model


def read(results, behaviour):
    d = results / "attribution" / behaviour
    return (
        pd.read_parquet(d / "heads.parquet"),
        pd.read_parquet(d / "components.parquet"),
        json.loads((d / "graph.json").read_text()),
    )


def top_head(scores: np.ndarray) -> tuple[int, int]:
    layer, head = np.unravel_index(np.argmax(scores), scores.shape)
    return int(layer), int(head)


def test_induction_finds_previous_token_and_induction_heads(outputs):
    results, model = outputs
    prompts = pd.read_parquet(results / "prompts" / "induction.parquet")
    prev, ind = attention_scores(model, prompts)
    # Induction needs composition: the induction head sits above layer 0.
    ind_head = top_head(ind[1:])
    ind_head = (ind_head[0] + 1, ind_head[1])
    prev_head = top_head(prev[: ind_head[0]])
    heads, _, graph = read(results, "induction")
    top = [(int(r.layer), int(r.head)) for r in heads.head(3).itertuples()]
    assert ind_head in top, (ind_head, prev, ind, heads)
    assert prev_head in top, (prev_head, prev, ind, heads)
    # Induction is an AND of its parts: patching any one of the embedding, the two heads or the
    # MLPs removes most of the behaviour, so single-node exact effects add up to several times
    # the total, which any additive method (IG, AtP) shares out instead. Integrated gradients
    # along the activation path, with each node's direct effect exact (attribution/direct.py),
    # still rank features as exact patching does: measured 0.94 and 0.93 over 48 on the
    # default (0.89 with the direct effect estimated too: the last layer's features scored
    # 0.29 of their exact effect; along the input path with fast scores over all prompts, as
    # before, 0.29), and all 56 nodes that can move the metric at 0.94. The three live heads
    # are the AND's parts themselves: exact patching charges each with the whole (9.9, 6.6 and
    # 6.6 against a total of 6.5) where IG shares it out, so IG need not order them as exact
    # does (-1.0 over the 3 on one training of the default, 1.0 with seed 1; the heads table
    # ranks them by their exact scores). The 5 pruned heads are inert: counted in as ties at
    # 0, they had made it 0.875 over 8. Edges: 0.985 over the 16 pairs of the graph's 12 score
    # nodes that have a direct path (the SAEs on both resid_posts cut the rest; with 8 such
    # pairs at weight 0 and exact 0 counted in, 0.995), 0.92 over 24 with the bridges.
    val = graph["validation"]
    by_kind = val["by_kind"]
    live = live_heads(model)
    assert by_kind["head"]["n_nodes"] == len(live) == 3, (by_kind["head"], live)
    assert by_kind["head"]["n_inert"] == model.cfg.n_layers * model.cfg.n_heads - len(live)
    feats = by_kind["feature"]
    # The default model trains a little differently on each CPU (its kernels round
    # differently): features agreed 0.944 and 0.929 on an AMD EPYC, 0.888 on an Intel Xeon.
    assert feats["n_nodes"] + feats["n_inert"] == 48 and feats["spearman"] >= 0.85, feats
    assert val["n_nodes"] >= 50 and val["spearman"] >= 0.9, val
    edges = graph["edge_validation"]
    # Edges: 0.923 on an AMD EPYC, 0.837 on an Intel Xeon (the same code; the model trains a
    # little differently): held to the stage's own threshold, spearman_threshold 0.8.
    assert 12 <= edges["n_edges"] <= 24 and edges["spearman"] >= 0.8, edges
    assert all(e["exact"] != 0 for e in edges["edges"]), edges
    # The graph holds the composition: the previous-token head reaches the induction head
    # through the layer-0 SAE, whose many small token features none make the cut on their own
    # (bridges, graph.py); without them the two heads had no path between them in graph.json.
    # Each token's feature carries a little of it (measured 0.06-0.18 a link), so the default
    # edge threshold keeps the bridges' links into the induction head and the page shows the
    # rest when the threshold is raised.
    computed = {(e["source"], e["target"]) for e in graph["computed_edges"]}
    kept = {(e["source"], e["target"]) for e in graph["edges"]}
    bridges = {n["id"] for n in graph["nodes"] if n["bridge"]}
    prev_id, ind_id = (f"head.{layer}.{head}" for layer, head in (prev_head, ind_head))
    assert {b for b in bridges if (prev_id, b) in computed and (b, ind_id) in computed}, computed
    assert {b for b in bridges if (b, ind_id) in kept}, kept
    # The features that matter most lead the fast ranking, where candidates are picked
    # (measured: all 5 of the 5).
    assert recall_of_largest_exact(results, "induction") >= 4
    check_graph_schema(graph)


def live_heads(model) -> list[tuple[int, int]]:
    """The heads the embedded model kept: the rest were pruned (W_O set to 0)."""
    return [
        (layer, head)
        for layer, block in enumerate(model.blocks)
        for head in range(model.cfg.n_heads)
        if block.attn.W_O[head].abs().sum() > 0
    ]


def recall_of_largest_exact(results, behaviour: str, n: int = 5, top: int = 10) -> int:
    """How many of the n validated features with the largest |exact effect| are among the top
    features by |fast score| over every feature."""
    feats = pd.read_parquet(results / "attribution" / behaviour / "features.parquet")
    feats = feats[feats["kind"] == "feature"]
    method = json.loads((results / "attribution" / behaviour / "graph.json").read_text())["method"]
    exact = feats.dropna(subset=["score_exact"])
    largest = exact.loc[exact["score_exact"].abs().nlargest(n).index]
    fast = feats.loc[feats[f"score_{method}"].abs().nlargest(top).index]
    ids = lambda f: set(zip(f["site"], f["layer"], f["feature"], strict=True))  # noqa: E731
    return len(ids(largest) & ids(fast))


def test_facts_fast_scores_nodes_and_edges_as_exact_patching_does(outputs):
    """Facts is additive (embedding -> MLPs): the fast method agrees with exact patching kind by
    kind and edge by edge. Measured on the default: features 0.99 over 48, heads 1.0 over the
    3 live ones, edges 0.95 over 24."""
    results, model = outputs
    graph = read(results, "facts")[2]
    by_kind = graph["validation"]["by_kind"]
    feats = by_kind["feature"]
    assert feats["n_nodes"] + feats["n_inert"] == 48 and feats["spearman"] >= 0.95, feats
    assert by_kind["head"]["n_nodes"] == len(live_heads(model))
    assert by_kind["head"]["spearman"] >= 0.9
    edges = graph["edge_validation"]
    assert edges["n_edges"] == 24 and edges["spearman"] >= 0.9
    assert recall_of_largest_exact(results, "facts") >= 4


def test_facts_runs_through_mlps_and_embedding_not_induction_heads(outputs):
    results, model = outputs
    prompts = pd.read_parquet(results / "prompts" / "induction.parquet")
    _, ind = attention_scores(model, prompts)
    heads, comps, graph = read(results, "facts")
    path = comps[comps["kind"].isin(["mlp", "embedding"])]["score"].abs().sum()
    head_total = comps[comps["kind"] == "head"]["score"].abs().sum()
    assert path > 3 * head_total
    layer, head = top_head(ind[1:])
    row = heads[(heads["layer"] == layer + 1) & (heads["head"] == head)].iloc[0]
    assert abs(row["score"]) < 0.1 * comps["score"].abs().max()
    assert comps.iloc[0]["kind"] in ("mlp", "embedding")
    check_graph_schema(graph)


def test_attribution_outputs(outputs):
    results, _ = outputs
    for behaviour in ("induction", "facts"):
        d = results / "attribution" / behaviour
        feats = pd.read_parquet(d / "features.parquet")
        assert {"layer", "feature", "score", "site"} <= set(feats.columns)
        assert (feats["kind"] == "error").sum() >= 1
        ctx = pd.read_parquet(d / "feature_contexts.parquet")
        assert len(ctx) > 0 and ctx["text"].str.contains(r"\[\[").all()
        page = (d / "graph.html").read_text()
        assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
        for png in ("heads.png", "features.png"):
            assert (d / png).stat().st_size > 1000


@pytest.mark.parametrize("behaviour", ["induction", "facts"])
def test_headlines_say_what_they_mean(outputs, behaviour):
    """The validation's verdict holds for every kind with enough nodes, not only pooled (on
    one training induction's features agreed 0.89 and its 3 live heads -0.5, with 0.91 over
    all nodes, which had read `passed: true`); the graph's edges show exact patching's weight
    wherever it was computed (embedding -> head.0.2: 1.94 fast, 10.9 exact on induction); the
    pruned heads are named inert and lead no top heads."""
    results, model = outputs
    heads, _, graph = read(results, behaviour)
    val = graph["validation"]
    judged = [k for k, v in val["by_kind"].items() if v["n_nodes"] >= val["min_kind_nodes"]]
    assert {"feature", "head"} <= set(judged)
    failed = sorted(k for k in judged if val["by_kind"][k]["passed"] is not True)
    assert val["failed_kinds"] == failed
    assert val["passed"] is (val["passed_all_nodes"] is True and not failed)
    assert val["passed_all_nodes"] is (val["spearman"] >= val["threshold"])
    computed = {(e["source"], e["target"]): e for e in graph["computed_edges"]}
    validated = graph["edge_validation"]["edges"]
    for v in validated:
        e = computed[(v["source"], v["target"])]
        assert (e["weight_source"], e["weight"], e["weight_fast"]) == ("exact", v["exact"],
                                                                        v["weight"])  # fmt: skip
    assert max(abs(v["exact"] - v["weight"]) for v in validated) > 0.1  # the case is there
    for (source, target), e in computed.items():
        if not any((v["source"], v["target"]) == (source, target) for v in validated):
            assert e["weight"] == e["weight_fast"]
            assert e["weight_source"] == ("exact" if target == "logit" else graph["method"])
    summary = json.loads((results / "attribution" / behaviour / "summary.json").read_text())
    live = live_heads(model)
    pruned = [(la, h) for la in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)
              if (la, h) not in live]  # fmt: skip
    assert summary["no_difference_heads"] == [f"L{la}H{h}" for la, h in pruned]
    assert {(h["layer"], h["head"]) for h in summary["top_heads"]} == set(live)
