"""Attribution: fast unit tests on a tiny random model with random SAEs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.schemas import check_graph_schema
from helpers.spliced import N_HEADS, N_LAYERS, tiny_spliced

from circuitflow.attribution import graph as circuit_graph
from circuitflow.attribution import scores as attr
from circuitflow.attribution import splice
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.page import graph_html


@pytest.fixture(scope="module")
def tiny():
    return tiny_spliced(8)


def test_splice_keeps_clean_logits_and_matches_sae_lens(tiny):
    model, saes, prompts = tiny
    tokens = torch.tensor(np.stack(prompts["clean_tokens"]))
    groups = splice.build_groups(N_LAYERS, [("resid_post", 0), ("resid_post", 1)])
    with torch.no_grad():
        plain = model(tokens)
        ours = splice.forward(model, tokens, groups, saes)
        with splice.sae_lens_spliced(model, saes) as hooked:
            lens_logits, cache = hooked.run_with_cache(tokens)
    torch.testing.assert_close(ours.logits, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lens_logits, plain, atol=1e-5, rtol=1e-5)
    for hook in saes:
        feats = ours.acts[hook + ".sae:feats"]
        assert (feats > 0).any()
        torch.testing.assert_close(feats, cache[hook + ".hook_sae_acts_post"], atol=1e-5, rtol=1e-5)


def test_splice_keeps_gradients_of_the_plain_model(tiny):
    """With the error term in the graph, upstream gradients equal the unspliced model's."""
    model, saes, prompts = tiny
    b = next(splice.iter_batches(prompts, 8, "cpu"))
    groups = splice.build_groups(N_LAYERS, [("resid_post", 0), ("resid_post", 1)])
    plain_groups = splice.build_groups(N_LAYERS, [])
    grads = []
    for gs, s in ((groups, saes), (plain_groups, {})):
        run = splice.forward(model, b.clean, gs, s)
        m = splice.logit_diff(run.logits, b.answer, b.distractor).sum()
        grads.append(torch.autograd.grad(m, run.acts["blocks.0.attn.hook_z"])[0])
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", ["atp", "ig"])
def test_fast_methods_against_exact(tiny, method):
    model, saes, prompts = tiny
    cfg = AttributionConfig(method=method, ig_steps=16, exact_features=4, batch_size=4)
    scores = attr.attribute(model, prompts, saes, cfg)
    frame = scores.frame
    assert {"head", "mlp", "embedding", "feature", "error"} <= set(frame["kind"])
    heads = frame[frame["kind"] == "head"]
    assert len(heads) == N_LAYERS * N_HEADS and heads["score_exact"].notna().all()
    val = attr.validation(frame, method, 0.8)
    assert val["n_nodes"] >= N_LAYERS * N_HEADS + N_LAYERS + 1
    if method == "ig":
        # Per-head IG integrates the head's own patch: it converges to exact patching.
        np.testing.assert_allclose(heads["score_ig"], heads["score_exact"], atol=0.05, rtol=0.05)
        emb = frame[frame["kind"] == "embedding"].iloc[0]
        assert emb["score_ig"] == pytest.approx(emb["score_exact"], rel=0.05, abs=0.05)
        assert val["spearman"] > 0.8
    # Embedding patch = the whole clean - corrupted difference.
    emb = frame[frame["kind"] == "embedding"].iloc[0]
    assert emb["score_exact"] == pytest.approx(
        scores.metric_clean - scores.metric_corrupted, abs=1e-4
    )


def test_graph_schema_pruning_and_html(tiny, tmp_path):
    model, saes, prompts = tiny
    cfg = AttributionConfig(method="atp", exact_features=0, max_graph_nodes=10)
    scores = attr.attribute(model, prompts, saes, cfg)
    frame = attr.with_score(scores.frame, cfg.method)
    nodes = circuit_graph.select_nodes(frame, cfg)
    assert 1 <= len(nodes) <= 10
    edges = circuit_graph.compute_edges(model, prompts, saes, scores.groups, nodes, cfg)
    meta = {
        "method": "atp",
        "metric_clean": scores.metric_clean,
        "metric_corrupted": scores.metric_corrupted,
        "validation": {"spearman": None},
    }
    graph = circuit_graph.build_graph(nodes, edges, cfg, N_LAYERS, meta)
    check_graph_schema(graph)
    page = graph_html(graph, "tiny")
    assert "<svg" in page and "src=" not in page and "href=" not in page
    json.dumps(graph)


def test_cumulative_keep():
    values = np.array([0.1, -5.0, 3.0, 1.0, 0.9])
    assert sorted(circuit_graph.cumulative_keep(values, 0.8).tolist()) == [1, 2]
    assert len(circuit_graph.cumulative_keep(values, 1.0)) == 5
    assert circuit_graph.cumulative_keep(values, 1.0, cap=2).tolist() == [1, 2]
