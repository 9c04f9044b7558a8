"""Attribution on the embedded default (the whole DAG, `default_results`): the circuits the
synthetic language plants are found, and the fast method agrees with exact patching."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr
from test_attribution import check_graph_schema

from circuitflow.models import load_model


def attention_scores(model, prompts: pd.DataFrame, seg: int = 10, n: int = 64):
    """Per head [layer, head]: previous-token score (attention to position q-1) and induction
    score (attention from a repeated token to the token after its previous occurrence), on
    random token sequences repeated twice; 0 for heads that write nothing. Independent of the
    attribution code."""
    bos = int(prompts["clean_tokens"].iloc[0][0])
    vocab = sorted({int(t) for ts in prompts["clean_tokens"] for t in ts[1:]})
    g = torch.Generator().manual_seed(0)
    seq = torch.tensor(vocab)[torch.randint(len(vocab), (n, seg), generator=g)]
    tokens = torch.cat([torch.full((n, 1), bos), seq, seq], dim=1)
    _, cache = model.run_with_cache(tokens)
    prev, ind = [], []
    q_all = torch.arange(2, tokens.shape[1])
    q_rep = torch.arange(seg + 1, tokens.shape[1])
    for layer in range(model.cfg.n_layers):
        pat = cache[f"blocks.{layer}.attn.hook_pattern"].mean(0)  # [head, query, key]
        # A pruned head (zero output weights) attends but writes nothing: it is no mechanism.
        live = model.blocks[layer].attn.W_O.flatten(1).norm(dim=1) > 0
        prev.append(pat[:, q_all, q_all - 1].mean(-1) * live)
        ind.append(pat[:, q_rep, q_rep - seg + 1].mean(-1) * live)
    return torch.stack(prev).detach().numpy(), torch.stack(ind).detach().numpy()


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
    # Heads, MLPs and the embedding: the fast method ranks them as exact patching does.
    components = pd.read_parquet(results / "attribution" / "induction" / "components.parquet")
    assert spearmanr(components["score_ig"], components["score_exact"]).statistic >= 0.9
    # With the SAE features included the stage's own validation passes its threshold (0.8).
    assert graph["validation"]["spearman"] >= graph["validation"]["threshold"]
    assert graph["validation"]["passed"] is True
    check_graph_schema(graph)


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
