"""circuit-tracer's published transcoders through the real DAG (Snakemake's CLI), on a tiny
Qwen3 with a local copy of a mwhanna_transcoder release built for it (conftest's
published_results: helpers.published_transcoders): loaded through SAELens's own conversion,
checked and adapted to the model as the pipeline loads it (the MLP norm's weight folded into
the encoder), evaluated, and drawn into per-prompt graphs that pass the checks the default
run's pass, as circuit-tracer files with its scan and Neuronpedia's pages. No download."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.dag import read_json
from helpers.published_transcoders import NEURONPEDIA_ID, SCAN

from circuitflow.attribution.prompt_graphs.files import cantor

pytestmark = pytest.mark.slow
CT_NODE_FIELDS = ["node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob",
                  "is_target_logit", "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp",
                  "influence", "activation"]  # fmt: skip


def test_published_transcoders_are_evaluated_by_one_job_and_nothing_is_trained(
    published_results,
):
    results = published_results
    log = (results.parent / "snakemake.log").read_text()
    assert "rule pretrained_sae_mlp_out_layer_0_to_1:" in log and "prefetch_saes" not in log
    for rule in ("rule capture:", "rule train_sae", "rule attribution:"):
        assert rule not in log, rule
    for layer in (0, 1):
        m = read_json(results / "saes" / "mlp_out" / f"layer_{layer}" / "metrics.json")
        assert (m["kind"], m["source"], m["tokens_trained"]) == ("transcoder", "pretrained", 0)
        assert m["format"] == "mwhanna_transcoder" and m["norm_folded"] is True
        assert m["hook_name"] == f"blocks.{layer}.ln2.hook_normalized"  # site mlp_in
        assert m["neuronpedia_id"] == NEURONPEDIA_ID.format(layer=layer)
        assert len(m["source_sha256"]) == 64
        summary = read_json(results / "features" / "mlp_out" / f"layer_{layer}" / "summary.json")
        assert summary["neuronpedia_id"] == m["neuronpedia_id"]


def test_the_replacement_score_is_the_model_with_the_releases_transcoders_on_its_mlps(
    published_results, tiny_qwen3_dir
):
    """saes/replacement.json's spliced loss against the model whose MLP modules are replaced
    by the release's transcoders as SAELens's conversion loads them (not adapted) reading the
    MLP module's own input (the real MLP kept at BOS tokens, where the token set's rows leave
    them out), on the token set's held-out contexts."""
    from sae_lens import SAE

    from circuitflow.capture.tokens import last_contexts, read_token_set
    from circuitflow.model.load import load_model
    from circuitflow.published import LOCAL_REPO, conversion_files

    results = published_results
    got = read_json(results / "saes" / "replacement.json")
    tokens, meta = read_token_set(results / "activations" / "tokens.npy",
                                  results / "activations" / "tokens.json")  # fmt: skip
    contexts = last_contexts(tokens, 8)
    bos = (contexts == int(meta["bos_token_id"]))[..., None]
    model = load_model(results / "model", "cpu", "float32")
    with conversion_files(results.parent / "release") as loaders:
        converter = loaders.NAMED_PRETRAINED_SAE_LOADERS["mwhanna_transcoder"]
        raw = {layer: SAE.from_pretrained(LOCAL_REPO, f"layer_{layer}.safetensors",
                                          converter=converter).eval()
               for layer in (0, 1)}  # fmt: skip

    class Swapped(torch.nn.Module):
        def __init__(self, tc, mlp):
            super().__init__()
            self.tc, self.mlp = tc, mlp

        def forward(self, x):
            return torch.where(bos, self.mlp(x), self.tc(x))

    with torch.no_grad():
        clean = model(contexts, return_type="loss").item()
        for layer, tc in raw.items():
            model.blocks[layer].mlp = Swapped(tc, model.blocks[layer].mlp)
        swapped = model(contexts, return_type="loss").item()
    assert got["ce_clean"] == pytest.approx(clean, abs=1e-5)
    assert got["ce_sae"] == pytest.approx(swapped, abs=1e-5)
    assert abs(got["ce_sae"] - got["ce_clean"]) > 1e-3  # the transcoders change the loss


def test_prompt_graphs_on_published_transcoders(published_results):
    """Each graph exact (its linearity error), the spliced model the real one, and a
    circuit-tracer file: its fields, error ids, the configured scan (no transcoder_list, as
    circuit-tracer writes a named set) and every feature's Neuronpedia page."""
    folder = published_results / "attribution" / "ioi" / "prompt_graphs"
    summary = read_json(folder / "summary.json")
    assert summary["linearity_max_abs_error"] < 1e-3
    assert summary["settings"]["scan"] == SCAN
    assert summary["neuronpedia"] == {str(n): NEURONPEDIA_ID.format(layer=n) for n in (0, 1)}
    for g in summary["graphs"]:
        assert g["n_features"] > 0 and 0 < g["replacement_score"] <= 1
        assert g["validation"]["spliced_metric"] == pytest.approx(g["metric"], abs=1e-4)
    index = read_json(folder / "graph-metadata.json")
    assert [g["slug"] for g in index["graphs"]] == ["ioi-0", "ioi-1"]
    graph = json.loads((folder / "ioi-0.json").read_text())
    assert graph["metadata"]["scan"] == SCAN and graph["metadata"]["transcoder_list"] == []
    kinds = {n["feature_type"] for n in graph["nodes"]}
    assert {"cross layer transcoder", "embedding", "logit"} <= kinds
    for node in graph["nodes"]:
        if node["feature_type"] == "cross layer transcoder":
            layer, feat, pos = map(int, node["node_id"].split("_"))
            assert list(node) == [*CT_NODE_FIELDS, "circuitflow"]
            assert node["feature"] == cantor(layer, feat) and node["ctx_idx"] == pos
            page = f"https://www.neuronpedia.org/{NEURONPEDIA_ID.format(layer=layer)}/{feat}"
            assert node["circuitflow"]["neuronpedia"] == page
        else:
            assert list(node) == CT_NODE_FIELDS
        if node["feature_type"] == "mlp reconstruction error":
            assert node["node_id"] == f"0_{node['layer']}_{node['ctx_idx']}"
    html = (folder.parent / "prompt_graphs.html").read_text()
    assert "https://www.neuronpedia.org/tiny-qwen3/0-transcoder-hp/" in html


def test_trained_saes_beside_published_transcoders(tmp_path):
    """sae.kind both with sae.transcoders.source pretrained beside captured SAEs: capture and
    train_sae make the SAEs alone, one published job each transcoder, and the per-prompt graphs
    and attribution run on both (a dry run of the tiny config; the other combinations' parts:
    tests/test_dictionary_sources.py)."""
    from helpers.dag import load_test_config, run_snakemake

    config = load_test_config("tiny")
    sae = {
        **config["sae"],
        "kind": "both",
        "source": "capture",
        "transcoders": {"source": "pretrained", **_published_transcoders(tmp_path, 64)},
    }
    config |= {"sae": sae, "attribution": {"prompt_graphs": 1}}  # fmt: skip
    done = run_snakemake(config, tmp_path / "run", "-n", "--quiet", "rules")
    rows = [line.split() for line in done.stdout.splitlines() if line[:1].isalpha()]
    counts = {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}
    assert counts["train_sae"] == 2 and counts["capture"] == 1, counts  # the SAEs' site alone
    assert {"pretrained_sae_mlp_out_layer_0", "pretrained_sae_mlp_out_layer_1"} <= counts.keys()
    assert {"prompt_graphs", "attribution", "transcoder_replacement"} <= counts.keys(), counts
    assert not {"train_sae_stream", "pretrained_sae_resid_post_layer_0"} & counts.keys()


def _published_transcoders(root, d_model: int) -> dict:
    """A TopK transcoder a layer in SAELens's format (as the default run saves its own), the
    sae.transcoders keys naming them."""
    from helpers.transcoders import random_transcoders
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuitflow.sae.transcoder import save_transcoder  # noqa: F401 - registers TopK

    cfg = HookedTransformerConfig(n_layers=2, d_model=d_model, n_ctx=8, d_head=8, n_heads=2,
                                  d_vocab=16, act_fn="gelu", normalization_type="LN")  # fmt: skip
    for layer, tc in random_transcoders(HookedTransformer(cfg), d_sae=32, k=4).items():
        tc.cfg.metadata.model_name = "embedded"
        tc.save_model(root / "mlp_out" / f"layer_{layer}")
    return {"path": str(root / "mlp_out" / "layer_{layer}")}
