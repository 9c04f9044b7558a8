"""Residual SAEs and transcoders in one run (sae.kind both) through the real DAG: the default
run (config/config.yaml trains both kinds on the embedded model). Capture writes each layer's
residual stream and MLP input and output from one pass, train_sae trains an SAE and a
transcoder per layer, transcoder_replacement replaces every MLP at once, prompt_graphs draws
per-prompt graphs on the transcoders, attribution and interventions run on the SAEs, and the
behaviour's report page leads with the per-prompt graphs and the component circuit. A run of
transcoders alone (sae.kind transcoder) stops before attribution and interventions, which splice
SAEs (dry runs of .test/config/transcoder.yaml)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import yaml
from helpers.dag import REPO, load_test_config, read_json, run_snakemake
from helpers.transcoders import swapped_loss, zeroed_loss

from circuitflow import config as cf_config
from circuitflow.attribution.prompt_graphs.files import cantor
from circuitflow.capture.files import read_activation_info
from circuitflow.model.load import load_model
from circuitflow.nodes import Node
from circuitflow.sae.data import load_eval_contexts
from circuitflow.sae.files import load_sae
from circuitflow.sae.transcoder import TopKTranscoder

pytestmark = pytest.mark.slow


# The default run trains both kinds (config/config.yaml: sae.kind both): its outputs are the ones
# checked here, so the suite runs no second whole DAG for transcoders.
DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.fixture(scope="module")
def run(default_results):
    return default_results, cf_config.resolve(DEFAULT, REPO)


def dry_run_jobs(config: dict, workdir) -> set[str]:
    done = run_snakemake(config, workdir, "-n")
    return {line.split()[0] for line in done.stdout.splitlines() if line[:1].isalpha()}


def test_the_whole_run_of_transcoders_alone_stops_after_the_prompt_graphs(tmp_path):
    """Attribution and interventions splice SAEs: `all` of a run of transcoders alone has none
    of their jobs, draws the per-prompt graphs, and still ends with the report's job costs.
    Streamed (sae.source stream), the transcoders train in the stream jobs and nothing is
    captured. Beside SAEs (sae.kind both), one stream job per layer trains both."""
    both = load_test_config("transcoder")
    jobs = dry_run_jobs(both, tmp_path / "both")
    assert {"capture", "train_sae", "transcoder_replacement", "prompt_graphs", "attribution",
            "interventions", "report_behaviour", "job_costs"} <= jobs  # fmt: skip
    both["sae"]["source"] = "stream"
    jobs = dry_run_jobs(both | {"sae": both["sae"] | {"stream": {"layers_per_job": 2}}},
                        tmp_path / "both-stream")  # fmt: skip
    stream_jobs = {"train_sae_stream_resid_post_layer_0_to_mlp_out_layer_0",
                   "train_sae_stream_resid_post_layer_1_to_mlp_out_layer_1"}  # fmt: skip
    assert stream_jobs | {"attribution", "prompt_graphs"} <= jobs, jobs
    config = load_test_config("transcoder") | {"sites": ["mlp_out"]}
    config["sae"] = config["sae"] | {"kind": "transcoder"}
    jobs = dry_run_jobs(config, tmp_path / "capture")
    assert {"capture", "train_sae", "transcoder_replacement", "sae_summary", "job_costs",
            "prompt_graphs"} <= jobs  # fmt: skip
    assert not {"attribution", "interventions", "report_behaviour"} & jobs, jobs
    config["sae"]["source"] = "stream"
    jobs = dry_run_jobs(config, tmp_path / "stream")
    assert {"train_sae_stream_mlp_out_layer_0", "transcoder_replacement"} <= jobs, jobs
    assert not {"capture", "train_sae", "attribution"} & jobs, jobs


def test_one_capture_feeds_a_transcoder_per_layer(run):
    results, _ = run
    assert (results / "benchmarks" / "capture.tsv").is_file()  # one capture job wrote both
    for layer in (0, 1):
        for site in ("mlp_in", "mlp_out"):
            info = read_activation_info(results / "activations" / site / f"layer_{layer}.h5")
            assert info.site == site and info.layer == layer
        tc = load_sae(results / "saes" / "mlp_out" / f"layer_{layer}")
        assert isinstance(tc, TopKTranscoder)
        assert tc.cfg.metadata.hook_name == f"blocks.{layer}.ln2.hook_normalized"
        assert tc.cfg.metadata.hook_name_out == f"blocks.{layer}.hook_mlp_out"
        m = read_json(results / "saes" / "mlp_out" / f"layer_{layer}" / "metrics.json")
        assert m["kind"] == "transcoder" and m["explained_variance"] > 0.8, m
        # Beside it, from the same capture, the layer's residual SAE (an SAE, not a transcoder).
        sae = load_sae(results / "saes" / "resid_post" / f"layer_{layer}")
        assert not isinstance(sae, TopKTranscoder)
        assert sae.cfg.metadata.hook_name == f"blocks.{layer}.hook_resid_post"
        m = read_json(results / "saes" / "resid_post" / f"layer_{layer}" / "metrics.json")
        assert m["kind"] == "sae" and m["explained_variance"] > 0.8, m
    table = pd.read_csv(results / "report" / "sae_metrics.csv")
    kinds = dict(zip(table.site, table.kind, strict=True))
    assert len(table) == 4 and kinds == {"resid_post": "sae", "mlp_out": "transcoder"}, table


def test_replacement_loss_is_the_model_with_every_mlp_swapped_out(run):
    """saes/replacement.json's loss against the model whose blocks' MLP modules are replaced
    by the transcoders (helpers.transcoders), on the same held-out contexts."""
    results, config = run
    got = read_json(results / "saes" / "replacement.json")
    info = read_activation_info(results / "activations" / "mlp_in" / "layer_0.h5")
    tokens = load_eval_contexts(info, config["sae"]["eval_contexts"])
    model = load_model(results / "model", "cpu", "float32")
    transcoders = {
        layer: load_sae(results / "saes" / "mlp_out" / f"layer_{layer}") for layer in (0, 1)
    }
    assert got["ce_sae"] == pytest.approx(swapped_loss(model, transcoders, tokens), abs=1e-5)
    assert got["ce_clean"] == pytest.approx(model(tokens, return_type="loss").item(), abs=1e-5)
    # The zero-ablation reference is every MLP zeroed at once (not one layer's, as in each
    # transcoder's own metrics.json).
    assert got["ce_zero"] == pytest.approx(zeroed_loss(model, (0, 1), tokens), abs=1e-5)
    alone = [
        read_json(results / "saes" / "mlp_out" / f"layer_{layer}" / "metrics.json")
        for layer in (0, 1)
    ]
    assert got["ce_clean"] == alone[0]["ce_clean"]
    assert got["ce_loss_recovered"] > 0.8 and set(got["layers"]) == {"0", "1"}


def test_prompt_graphs_are_circuit_tracer_files_with_a_summary(run):
    """attribution/{behaviour}/prompt_graphs: a graph file per prompt (the first
    attribution.prompt_graphs), listed in graph-metadata.json, each graph exact (its linearity
    error) and checked on the model (validation), its cost counted."""
    results, config = run
    folder = results / "attribution" / "induction" / "prompt_graphs"
    n = config["attribution"]["prompt_graphs"]
    summary = read_json(folder / "summary.json")
    index = read_json(folder / "graph-metadata.json")
    slugs = [g["metadata"]["slug"] for g in map(read_json, sorted(folder.glob("induction-*.json")))]
    assert sorted(g["slug"] for g in index["graphs"]) == sorted(slugs)
    assert [g["slug"] for g in summary["graphs"]] == [f"induction-{i}" for i in range(n)]
    assert summary["linearity_max_abs_error"] < 1e-3
    for g in summary["graphs"]:
        assert 0 < g["replacement_score"] <= 1 and 0 < g["completeness_score"] <= 1
        assert g["validation"]["spliced_metric"] == pytest.approx(g["metric"], abs=1e-4)
        assert g["forward_equivalents"] >= 3 * g["n_features"]
    parts = summary["forward_equivalents_by_part"]
    assert {"graph_rows", "edge_heads", "validation"} <= set(parts), parts
    graph = read_json(folder / "induction-0.json")
    assert {n["feature_type"] for n in graph["nodes"]} >= {"embedding", "logit"}
    assert graph["circuitflow"]["prompt_id"] == 0
    contexts = pd.read_parquet(folder / "feature_contexts.parquet")
    assert set(contexts.site) == {"mlp_out"} and (contexts.activation > 0).all()
    # The job's memory request covers its peak (the plan: model, rows, dense adjacency).
    from circuitflow import resources
    from circuitflow.report.job_costs import read_benchmark

    peak = float(
        read_benchmark(results / "benchmarks" / "prompt_graphs" / "induction.tsv")["max_rss"]
    )
    assert resources.job_peak_bytes(config, "prompt_graphs", "cpu") / 2**20 >= 0.8 * peak
    assert resources.mem_mb(config | {"device": "cpu"}, "prompt_graphs") >= peak


def test_prompt_graph_page_in_chromium(run, tmp_path):
    """prompt_graphs.html as a reader sees it: each prompt's tokens along the bottom in order, every
    node in its position's column and its layer's band, a feature's card with its contexts,
    an edge's card with the heads carrying it, thresholds that re-prune, a prompt menu."""
    from helpers.chromium import chromium
    from helpers.graph_page import PROMPT_CHECKS_JS, check_page

    results, config = run
    page = results / "attribution" / "induction" / "prompt_graphs.html"
    out = check_page(chromium(), page, tmp_path, PROMPT_CHECKS_JS, node_low=0.3, node_high=0.95)
    assert out["errors"] == [], out["errors"]
    tokens = out["tokens_json"]
    default = out["default"]
    labels = sorted(default["labels"], key=lambda t: t["pos"])
    assert [t["text"] for t in labels] == tokens[0]
    xs = [t["x"] for t in labels]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    col = xs[1] - xs[0]
    kinds = [n["kind"] for n in default["nodes"]]
    assert kinds.count("token") == len(tokens[0]) and kinds.count("logit") == 1
    assert kinds.count("feature") >= 1
    bands = default["bands"]
    for n in default["nodes"]:
        assert abs(n["x"] - xs[n["pos"]]) <= col / 2, n  # in its position's column
        band = bands[n["row"]]
        assert band["y"] <= n["y"] <= band["y"] + band["h"], n  # in its layer's band
    assert all(t["y"] > max(n["y"] for n in default["nodes"]) for t in labels)  # tokens below
    feature = out["feature_card"]
    assert not feature["hidden"] and feature["hidden_after"]
    assert "top activating contexts" in feature["text"] and feature["items"] >= 1
    # Each feature's card shows its clerp from the prompt's graph file, and a click opens its
    # card from its transcoder's page of the feature browser, which holds it with the same
    # label.
    graph = read_json(page.parent / "prompt_graphs" / f"{out['slug']}.json")
    clerps = {(n["layer"], n["feature"]): n["clerp"] for n in graph["nodes"]
              if n["feature_type"] == "cross layer transcoder"}  # fmt: skip
    browser_labels = {}
    for browser_page in (results / "report" / "features" / "mlp_out").glob("layer_*.html"):
        d = json.loads(re.search(r'id="feature-data">(.*?)</script>', browser_page.read_text(),
                                 re.S)[1])["dictionary"]  # fmt: skip
        browser_labels |= {
            f"{d['key']}.f{f}": (browser_page, label)
            for f, label in zip(d["features"]["feature"], d["features"]["label"], strict=True)
        }
    assert out["features"]
    for f in out["features"]:
        layer, index = map(int, re.match(r"feature L(\d+) #(\d+) ", f["title"]).groups())
        clerp = clerps[(str(layer), cantor(layer, index))]
        assert clerp and f["label"] == f"label: {clerp}"
        target, anchor = f["href"].split("#")
        assert anchor == Node("feature", layer, index, "mlp_out").anchor
        assert (page.parent / target).resolve() == browser_labels[anchor][0].resolve()
        assert browser_labels[anchor][1] == clerp
        assert not f["panel"]["hidden"] and f["panel"]["src"] == f["href"]
    edge = out["edge_card"]
    assert edge and edge["heads"] and "% of the edge" in edge["heads"][0], edge
    assert "replacement score" in out["scores"] and "Spearman" in out["scores"]
    sizes = [len(out[k]["nodes"]) for k in ("low", "default", "high")]
    assert sizes[0] < sizes[1] <= sizes[2], sizes
    assert out["n_prompts"] == len(tokens) == config["attribution"]["prompt_graphs"]
    last = sorted(out["last_prompt"]["labels"], key=lambda t: t["pos"])
    assert [t["text"] for t in last] == tokens[-1]


def test_the_behaviour_page_leads_with_the_prompt_graphs_and_the_component_circuit(run):
    """report/{behaviour}/tables.html of a run of both kinds: first the per-prompt graphs (one
    row per graph, its numbers those of prompt_graphs/summary.json), then the component circuit
    beside the SAE feature circuit, held out beside selection (interventions/summary.json);
    attribution splices the SAEs alone (no transcoder feature among its nodes)."""
    import html

    results, _ = run
    page = html.unescape((results / "report" / "induction" / "tables.html").read_text())
    heads = [
        page.index(h)
        for h in (
            "Per-prompt graphs on the transcoders",
            "Circuits, held out beside selection",
            "Flags on these",
        )
    ]
    assert heads == sorted(heads), heads
    graphs = read_json(results / "attribution" / "induction" / "prompt_graphs" / "summary.json")
    section = page[heads[0] : heads[1]]
    for g in graphs["graphs"]:
        assert f"{g['replacement_score']:.3f}" in section and f"{g['kept_features']} /" in section
    summary = read_json(results / "interventions" / "induction" / "summary.json")
    comp = summary["component_circuit"]
    section = page[heads[1] : heads[2]]
    assert comp["size"] is not None and f"{comp['faithfulness_heldout']:.3f}" in section
    assert set(comp["by_kind"]) <= {"embedding", "head", "mlp"}
    assert f"{summary['faithfulness_heldout']:.3f}" in section
    features = pd.read_parquet(results / "attribution" / "induction" / "features.parquet")
    assert set(features.site) == {"resid_post"}
