"""The real DAG on TransformerLens checkpoint directories (conftest's tl_checkpoints;
helpers.tl_checkpoints plants a previous-token head in each) of the two shapes whose stages
take their own paths, at config/your-own-model.yaml's settings cut to test sizes: without
LayerNorm (the MLP reads hook_resid_mid: SAEs and transcoders, per-prompt graphs, attribution,
interventions) and attention-only (no MLP node anywhere: SAEs, attribution, interventions). The
prompts ask for the word before the last one, which only the planted head moves: attribution
must rank it first, ablating it must break the behaviour, and the per-prompt graphs must trace
the answer to that word through that head. With LayerNorm and MLPs a checkpoint takes the
embedded default's hooks, which its run checks; tests/model/test_checkpoint.py loads that
shape too. One Snakemake run per shape (a run holds one model), to its own last targets only.
"""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import yaml
from helpers import tl_checkpoints as tl
from helpers.dag import REPO, read_json, run_snakemake

from circuitflow.model import checkpoint
from circuitflow.nodes import hook_name

pytestmark = pytest.mark.slow
EXAMPLE = yaml.safe_load((REPO / "config" / "your-own-model.yaml").read_text())
# Test sizes: a few prompts, rows and latents, few seeds and random controls.
SMALL = {
    "capture": {"n_tokens": 2048},
    "sae": {"d_sae": 64, "k": 4, "total_tokens": 4096, "eval_contexts": 8},
    "attribution": {"ig_steps": 4, "validation_features": 8, "prompt_graphs": 2},
    "interventions": {"n_seeds": 2, "n_random_circuits": 3, "n_random_sets": 3},
    "features": {"held_out_tokens": 1024},  # the test corpus holds about 17,000 tokens
}
# Each shape's own settings. The dictionaries stream from the model, one job for all of a
# run's (capture is generic; tests/capture checks the hook two sites share without norms).
STREAM = {"source": "stream", "stream": {"layers_per_job": 2}}
SHAPES = {
    "no_ln": {"sae": STREAM},
    "attn_only": {"layers": [1], "sae": STREAM | {"kind": "sae"},
                  "attribution": {"prompt_graphs": 0}},
    # Layer 0's MLP writes nothing: its transcoder trains from captured files (the default
    # source, one job a dictionary) on a target with no variance (issue 56).
    "silent_mlp": {"layers": [0, 1]},
}  # fmt: skip
N_PROMPTS = 16


def merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def run_shape(shape: str, ckpt, workdir) -> dict:
    workdir.mkdir(parents=True)
    prompts = tl.prompts_csv(workdir / "previous.csv", N_PROMPTS)
    config = merged({k: v for k, v in EXAMPLE.items() if k != "outdir"}, SMALL)
    config = merged(config, SHAPES[shape])
    config = merged(config, {
        "model": {"name": str(ckpt)},
        "behaviours": {"previous": {"path": str(prompts), "n_prompts": N_PROMPTS}},
        "capture": {"corpus": str(tl.corpus(workdir / "corpus.txt"))},
    })  # fmt: skip
    results = workdir / "results"
    targets = [results / "interventions" / "previous" / "summary.json"]
    if shape in ("no_ln", "silent_mlp"):
        targets.append(results / "attribution" / "previous" / "prompt_graphs")
    # One core: the jobs run one after another anyway, and one thread each spins no OpenMP
    # threads on cores the suite's other workers need.
    done = run_snakemake(config, workdir, "--cores", "1", *map(str, targets), prefork=True)
    (workdir / "snakemake.log").write_text(done.stdout + done.stderr)
    return {"results": results, "ckpt": ckpt, "model": tl.build(shape)}


@pytest.fixture(scope="module")
def runs(tl_checkpoints, tmp_path_factory):
    """shape -> its run (results, checkpoint, the model built again), each run once, when a
    test first asks for it; a run that failed fails its other tests at once, with its error."""
    done: dict[str, dict | BaseException] = {}
    root = tmp_path_factory.mktemp("tl-checkpoint-runs")

    def get(shape: str) -> dict:
        if shape not in done:
            try:
                done[shape] = run_shape(shape, tl_checkpoints[shape], root / shape)
            except Exception as err:
                done[shape] = err
                raise
        if isinstance(done[shape], BaseException):
            pytest.fail(f"the {shape} run failed: {done[shape]}"[:5000])
        return done[shape]

    return get


@pytest.mark.parametrize("shape", SHAPES)
def test_the_planted_head_is_ranked_first_and_its_ablation_breaks_the_behaviour(shape, runs):
    run = runs(shape)
    results, planted = run["results"], (run["model"].cfg.n_layers - 1, tl.PLANTED)
    baseline = read_json(results / "baseline" / "previous.json")
    assert baseline["accuracy"] == 1.0 and baseline["n_prompts"] == N_PROMPTS, baseline
    heads = pd.read_parquet(results / "attribution" / "previous" / "heads.parquet")
    assert (int(heads.layer[0]), int(heads["head"][0])) == planted, heads
    assert abs(heads.score[0]) > 10 * heads.score[1:].abs().max(), heads
    ablated = pd.read_parquet(results / "interventions" / "previous" / "heads.parquet")
    single = ablated.sort_values("drop_frac", ascending=False).reset_index(drop=True)
    assert (int(single.layer[0]), int(single["head"][0])) == planted, single
    # Mean-ablating the decoy raises the metric a little with LayerNorm (its loud write no
    # longer shrinks the planted head's share of the normalised residual): measured -0.20.
    assert single.drop_frac[0] > 0.5 and single.drop_frac[1:].max() < 0.25, single


@pytest.mark.parametrize("shape", SHAPES)
def test_the_model_stage_describes_the_checkpoint_where_it_lies(shape, runs):
    run = runs(shape)
    info = read_json(run["results"] / "model" / "model.json")
    assert info["kind"] == "tl_checkpoint" and info["path"] == str(run["ckpt"].resolve())
    assert info["weights_sha256"] == checkpoint.fingerprint(run["ckpt"])
    tokens = read_json(run["results"] / "activations" / "tokens.json")
    baseline = read_json(run["results"] / "baseline" / "previous.json")
    assert tokens["model_hash"] == baseline["model_weights_sha256"] == info["weights_sha256"]


def test_the_transcoder_reads_what_the_mlp_receives(runs):
    """Without LayerNorm the MLP reads the residual stream as it is: hook_resid_mid."""
    run = runs("no_ln")
    cfg = json.loads((run["results"] / "saes" / "mlp_out" / "layer_0" / "cfg.json").read_text())
    assert hook_name("mlp_in", 0, run["model"].cfg.normalization_type) == "blocks.0.hook_resid_mid"
    assert cfg["metadata"]["hook_name"] == "blocks.0.hook_resid_mid"
    assert cfg["metadata"]["hook_name_out"] == "blocks.0.hook_mlp_out"


def test_per_prompt_graphs_trace_the_answer_to_the_word_before_the_last(runs):
    """Each graph's strongest input to the logit is the embedding of the word before the last,
    and the edge goes through the planted head; the graph is linear to float32 rounding."""
    run = runs("no_ln")
    folder = run["results"] / "attribution" / "previous" / "prompt_graphs"
    prompts = pd.read_parquet(run["results"] / "prompts" / "previous.parquet")
    summary = read_json(folder / "summary.json")
    assert len(summary["graphs"]) == SMALL["attribution"]["prompt_graphs"]
    for row in summary["graphs"]:
        n_tokens = len(prompts.clean_tokens[row["prompt_id"]])
        assert row["top_token_position"] == n_tokens - 2, row
        assert row["linearity_max_abs_error"] < 1e-4, row
        graph = read_json(folder / f"{row['slug']}.json")
        logit = next(n["node_id"] for n in graph["nodes"] if n["is_target_logit"])
        links = [link for link in graph["links"] if link["target"] == logit]
        top = max(links, key=lambda link: abs(link["weight"]))
        source = next(n for n in graph["nodes"] if n["node_id"] == top["source"])
        assert (source["feature_type"], source["ctx_idx"]) == ("embedding", n_tokens - 2), top
        via = max(top["heads"], key=lambda h: abs(h["weight"]))
        assert (via["layer"], via["head"]) == (0, tl.PLANTED), top


def test_an_attention_only_model_has_heads_and_no_mlp_nodes(runs):
    results = runs("attn_only")["results"]
    components = pd.read_parquet(results / "attribution" / "previous" / "components.parquet")
    assert set(components.kind) == {"embedding", "head"}
    graph = read_json(results / "attribution" / "previous" / "graph.json")
    assert not [n for n in graph["nodes"] if n["kind"] == "mlp"]
    assert sorted(p.name for p in (results / "saes").iterdir()) == ["resid_post"]


def test_a_layer_whose_mlp_writes_nothing_is_data_not_a_crash(runs):
    """The silent MLP's transcoder trains and is measured: its explained variance is undefined
    (no variance to explain), said as such, not a division by zero; the run goes on to the
    interventions and the per-prompt graphs, where that MLP carries nothing."""
    run = runs("silent_mlp")
    results, silent = run["results"], tl.SILENT_MLP["silent_mlp"]
    metrics = read_json(results / "saes" / "mlp_out" / f"layer_{silent}" / "metrics.json")
    assert metrics["explained_variance"] is None and metrics["target_variance"] == 0.0, metrics
    assert metrics["ce_clean"] == metrics["ce_zero"] and metrics["ce_loss_recovered"] is None
    live = read_json(results / "saes" / "mlp_out" / "layer_1" / "metrics.json")
    assert live["target_variance"] > 0 and isinstance(live["explained_variance"], float), live
    log = (results / "logs" / "train_sae" / f"mlp_out_layer_{silent}.log").read_text()
    assert "explained_variance=undefined (the target is constant: variance 0)" in log, log[-2000:]
    components = pd.read_parquet(results / "attribution" / "previous" / "components.parquet")
    mlp = components[(components.kind == "mlp") & (components.layer == silent)]
    assert len(mlp) == 1 and (
        mlp.select_dtypes("number").drop(columns=["layer", "index"]) == 0
    ).all(axis=None), mlp.T
    assert read_json(results / "interventions" / "previous" / "summary.json")
    graphs = read_json(results / "attribution" / "previous" / "prompt_graphs" / "summary.json")
    for row in graphs["graphs"]:
        assert 0 <= row["replacement_score"] <= 1 and 0 <= row["completeness_score"] <= 1, row
