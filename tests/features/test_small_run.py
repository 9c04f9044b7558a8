"""The features stage in the whole DAG (.test/config/small.yaml, the shared small run): the
rule writes its dictionary's folder with the documented files, read from the token set as
planned, and graph.json's feature nodes carry the labels it wrote."""

from __future__ import annotations

import json

import pandas as pd
from helpers.dag import load_test_config

from circuitflow import config as cf_config
from circuitflow.features import write


def test_the_features_rule_writes_every_dictionary(small_results):
    config = cf_config.resolve(load_test_config("small"))
    folder = write.feature_dir(small_results, "resid_post", 1)
    written = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert written == ["contexts.parquet", "examples.parquet", "features.parquet", "summary.json"]
    summary = json.loads((folder / "summary.json").read_text())
    feats = pd.read_parquet(folder / "features.parquet")
    tokens = json.loads((small_results / "activations" / "tokens.json").read_text())
    # The whole token set (8,192 rows: fewer than features.n_tokens), BOS left out, every
    # context trained on (sae.source capture).
    assert summary["n_contexts"] == tokens["n_contexts"]
    assert summary["n_tokens"] == tokens["n_contexts"] * (tokens["context_length"] - 1)
    assert (summary["contexts_held_out"], summary["contexts_trained_on"]) == (
        0, tokens["n_contexts"],
    )  # fmt: skip
    assert summary["hook"] == "blocks.1.hook_resid_post" and summary["dictionary_kind"] == "sae"
    assert len(feats) == summary["n_features"] == 8 * 64
    assert summary["dead_fraction"] == feats["dead"].mean()
    assert config["features"]["k"] == summary["k"]
    # Its labels scored on the held-out contexts (rule held_out_tokens), whole ones.
    held = json.loads((small_results / "activations" / "held_out_tokens.json").read_text())
    assert summary["labels"]["held_out_tokens"] == held["n_contexts"] * 31 >= 16384
    assert held["held_out_from"] == tokens["token_set_hash"]
    assert (small_results / "benchmarks" / "features" / "layer_1.tsv").is_file()
    assert not (small_results / "checkpoints" / "features" / "layer_1" / "state.pt").exists()


def test_graph_json_features_carry_their_labels(small_results):
    labels = write.read_labels([write.feature_dir(small_results, "resid_post", 1)])
    graph = json.loads((small_results / "attribution" / "induction" / "graph.json").read_text())
    features = [n for n in graph["nodes"] if n["kind"] == "feature"]
    assert features
    for node in features:
        assert node["label"] == labels[(node["site"], node["layer"])][node["index"]]
    assert all(n["label"] is None for n in graph["nodes"] if n["kind"] != "feature")
