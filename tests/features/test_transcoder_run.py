"""The features stage end to end on a transcoder of a tiny GPT-2 (its own BPE tokenizer, random
weights): model.json, a token set and a saved transcoder in, its folder out; then the per-prompt
graphs read that folder: each feature node's clerp is its label, which the page's cards show
beside a link to the feature's card in the browser, and the page's contexts are the stage's top
contexts, with no pass over the token set of their own."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers.transcoders import random_transcoders

from circuitflow.features import stage as features_stage
from circuitflow.features import write

N, T, ANSWER, DISTRACTOR = 24, 12, 30, 31


@pytest.fixture(scope="module")
def run(tiny_hf_model_dir, tmp_path_factory):
    from circuitflow.io import write_json
    from circuitflow.model.load import load_model, prefetch

    tmp = tmp_path_factory.mktemp("transcoder-run")
    model_dir = tmp / "model"
    model_dir.mkdir()
    write_json(model_dir / "model.json", prefetch(str(tiny_hf_model_dir)))
    model = load_model(model_dir, "cpu", "float32")
    tc_dir = tmp / "saes" / "mlp_out" / "layer_0"
    random_transcoders(model, d_sae=48, k=4)[0].save_model(tc_dir)
    tokens = np.random.default_rng(0).integers(20, 200, size=(N, T)).astype(np.int32)
    tokens[:, 0] = 0
    np.save(tmp / "tokens.npy", tokens)
    write_json(tmp / "tokens.json", {"n_contexts": N, "context_length": T})
    held = np.random.default_rng(1).integers(20, 200, size=(4, T)).astype(np.int32)
    held[:, 0] = 0  # contexts the labels are scored on (held_out.py writes them in a run)
    np.save(tmp / "held.npy", held)
    write_json(tmp / "held.json", {"n_contexts": 4, "context_length": T})
    config = {
        "seed": 0, "device": "cpu", "model": {"name": str(tiny_hf_model_dir), "dtype": "float32"},
        "capture": {"exclude_bos": True}, "sae": {"source": "capture"},
        "features": {"batch_contexts": 5, "k": 3, "samples": 1, "n_tokens": 10 * (T - 1)},
        "attribution": {"prompt_graphs": 1, "prompt_graph_validation_features": 2,
                        "prompt_graph_node_threshold": 1.0, "prompt_graph_edge_threshold": 1.0,
                        "n_contexts": 2},
    }  # fmt: skip
    out = write.feature_dir(tmp, "mlp_out", 0)
    held_out = (tmp / "held.npy", tmp / "held.json")
    (summary,) = features_stage.run(config, model_dir / "model.json", tmp / "tokens.npy",
                                    tmp / "tokens.json", [tc_dir], [out], held_out,
                                    tmp / "ckpt")  # fmt: skip
    return tmp, model_dir, tc_dir, tokens, config, out, summary


def test_the_stage_writes_a_transcoders_folder(run):
    _, _, _, tokens, _, out, summary = run
    assert summary["dictionary_kind"] == "transcoder"
    assert summary["hook"] == "blocks.0.ln2.hook_normalized"  # what it reads
    assert summary["n_contexts"] == 10 and summary["n_tokens"] == 10 * (T - 1)
    assert summary["contexts_trained_on"] == 10 and summary["contexts_held_out"] == 0
    # Its cost a context: the pass through 1 of 2 layers, and its windows' re-read (at most
    # every context again, through its layer).
    parts = summary["forward_equivalents_by_part"]
    assert parts["pass"] == pytest.approx(0.5) and 0 < parts["windows"] <= 0.5
    assert parts["held_out"] == pytest.approx(4 / 10 * 0.5)  # 4 held-out contexts, per 10 read
    assert summary["forward_equivalents_per_prompt"] == pytest.approx(sum(parts.values()))
    assert summary["forward_equivalents_unit"] == "context"
    feats = pd.read_parquet(out / "features.parquet")
    ctx = pd.read_parquet(out / "contexts.parquet")
    assert len(feats) == 48 and feats["count"].sum() > 0
    assert ctx["context"].between(0, 9).all()  # the first ten rows of the token set
    for row in ctx.itertuples():
        window = tokens[row.context, row.window_start : row.window_start + len(row.tokens)]
        np.testing.assert_array_equal(row.tokens, window)
    assert not (run[0] / "ckpt" / features_stage.CHECKPOINT).exists()  # removed once written


def test_prompt_graphs_take_labels_and_contexts_from_the_stage(run):
    from circuitflow.attribution.prompt_graphs import stage

    tmp, model_dir, tc_dir, tokens, config, out, _ = run
    prompt = [0, *range(20, 29)]
    pd.DataFrame({"prompt_id": [0], "clean_tokens": [prompt], "corrupted_tokens": [prompt[::-1]],
                  "answer_id": [ANSWER], "distractor_id": [DISTRACTOR]}
                 ).to_parquet(tmp / "prompts.parquet")  # fmt: skip
    graphs = tmp / "prompt_graphs"
    summary = stage.run(config, "b", tmp / "prompts.parquet", model_dir / "model.json", [tc_dir],
                        graphs, feature_dirs=[out],
                        features_html=tmp / "report" / "features.html")  # fmt: skip
    assert "contexts" not in summary["forward_equivalents_by_part"]  # no pass of its own
    labels = write.read_labels([out])[("mlp_out", 0)]
    nodes = json.loads((graphs / "b-0.json").read_text())["nodes"]
    feats = [n for n in nodes if n["feature_type"] == "cross layer transcoder"]
    assert feats
    for node in feats:
        layer, feat, _ = map(int, node["node_id"].split("_"))
        assert node["clerp"] == labels[feat] and node["clerp"]
    # The page: each drawn feature's card shows its clerp; a click opens its card from its
    # transcoder's page of the feature browser in the panel beside the graph.
    from helpers.chromium import chromium
    from helpers.graph_page import PROMPT_CHECKS_JS, check_page

    seen = check_page(chromium(), graphs.with_suffix(".html"), tmp, PROMPT_CHECKS_JS,
                      node_low=0.3, node_high=1.0)  # fmt: skip
    assert seen["errors"] == [] and seen["features"]
    for f in seen["features"]:
        feat = int(f["title"].split("#")[1].split()[0])
        assert f["label"] == f"label: {labels[feat]}"
        assert f["href"] == f"report/features/mlp_out/layer_0.html#mlp_out.0.f{feat}"
        assert not f["panel"]["hidden"] and f["panel"]["src"] == f["panel"]["tab"] == f["href"]
        assert f["panel_hidden_after_escape"]
    found = pd.read_parquet(graphs / "feature_contexts.parquet")
    ours = pd.read_parquet(out / "contexts.parquet").query("kind == 'top' and rank < 2")
    kept = {int(n["node_id"].split("_")[1]) for n in feats}
    assert set(found["feature"]) == kept & set(ours["feature"])
    want = ours[ours["feature"].isin(kept)].sort_values(["feature", "rank"])
    np.testing.assert_array_equal(found["activation"], want["activation"])
    for row in found.itertuples():
        ctx, pos = divmod(row.row, T - 1)
        assert (ctx, pos + 1) == (row.context, row.position)
        assert tokens[row.context, row.position] in row.tokens and "[[" in row.text
