"""Per-prompt graphs with dead transcoders (no latent fires on the prompt): the graph has no
feature nodes, every MLP's output is its error node, and each step of the prompt_graphs job
(prune, heads, validate, scores, the graph file, the page) finishes and says so."""

from __future__ import annotations

import json

import pytest
from helpers.sae_data import contexts, tiny_model
from helpers.transcoders import random_transcoders

from circuitflow.attribution.prompt_graphs import files, heads, page, prune, replacement, validate
from circuitflow.attribution.prompt_graphs.stage import describe

ANSWER, DISTRACTOR = 7, 11


@pytest.fixture(scope="module")
def setup():
    model = tiny_model()
    for p in model.parameters():
        p.requires_grad_(False)
    tcs = random_transcoders(model, d_sae=24, k=3)
    for tc in tcs.values():
        tc.b_enc.fill_(-1e4)  # TopK keeps 3 pre-activations, every one <= 0
    return model, tcs, contexts(1, seed=5)[0, :12].tolist()


def test_a_graph_of_dead_transcoders_has_no_features_and_is_written(setup):
    model, tcs, tokens = setup
    graph = replacement.build(model, tcs, tokens, ANSWER, DISTRACTOR, skip_bos=True,
                              max_feature_nodes=100, batch_size=16)  # fmt: skip
    assert graph.n_features == 0 and graph.dropped_features == 0
    kinds = graph.kinds()
    pruned = prune.prune(graph.adjacency, kinds, 0.8, 0.98)
    edge_heads = heads.split_edges(graph, pruned.edge_mask, 4, 16, 8, pruned.node_influence)
    checked = validate.validate(graph, pruned.node_mask, pruned.node_influence, 5, 0.5)
    scores = prune.scores(graph.adjacency, kinds)
    summary = describe(graph, pruned, scores, 0) | {"validation": checked, "slug": "p-0"}
    content = files.graph_file(
        graph, pruned, slug="p-0", scan="tiny", transcoder_list=[], prompt="p",
        prompt_tokens=[str(t) for t in tokens], node_threshold=0.8, answer_text="a",
        distractor_text="b", answer_prob=0.5, extra=summary, edge_heads=edge_heads,
    )  # fmt: skip
    data = page.graph_data(graph, pruned, edge_heads, [str(t) for t in tokens], summary)
    html = page.page_html("t", [data], None, 0.8, 0.98)
    text = json.dumps(content, allow_nan=False) + json.dumps(data, allow_nan=False)
    assert "NaN" not in html and text
    assert summary["kept_features"] == 0 and checked["faithfulness"] is None
    assert checked["undefined"]["faithfulness"] == "no active features: m_clean = m_none"
    assert "needs 3" in checked["undefined"]["spearman"]
    # The MLPs' outputs are all error nodes: the replacement score is the tokens' share alone.
    assert 0 <= scores["replacement_score"] <= 1 and 0 <= scores["completeness_score"] <= 1
