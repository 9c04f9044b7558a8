"""The DAG with `sae.source: stream` on .test/config/tiny.yaml's settings, to interventions: the
SAEs of both layers train in one job from one stream of the model's forward passes, no activation
file is written, and attribution (feature contexts from the features stage) and interventions run
on them. The report rules are the default run's to test (tests/workflow/test_report_dag.py):
here the job-cost table is built from this run's benchmarks by the code the rule runs."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers.dag import load_test_config, place_model, run_snakemake

from circuitflow import config as cf_config
from circuitflow import resources, stream_groups
from circuitflow.report.job_costs import job_costs, read_benchmark

pytestmark = pytest.mark.slow
SAE = {"source": "stream", "stream": {"layers_per_job": 2}}


@pytest.fixture(scope="module")
def stream_run(tmp_path_factory, tiny_model):
    config = load_test_config("tiny")
    config["sae"] |= SAE
    # One behaviour: what these tests check is per SAE, not per behaviour (suite time).
    config["behaviours"] = {"induction": config["behaviours"]["induction"]}
    workdir = tmp_path_factory.mktemp("stream-run")
    place_model(tiny_model, config, workdir / "results")
    run_snakemake(config, workdir, *targets(workdir / "results"))
    return workdir, config


def targets(results) -> list[str]:
    """What these tests read: the dictionaries, attribution and interventions (the features and
    held-out jobs come with them); not the report's dozen small jobs (suite time)."""
    out = [results / "saes" / "resid_post" / f"layer_{layer}" for layer in (0, 1)]
    out += [results / "attribution" / "induction" / "features.parquet"]
    out += [results / "interventions" / "induction" / "summary.json"]
    return [str(p) for p in out]


def test_one_job_trains_both_layers_without_activation_files(stream_run):
    workdir, config = stream_run
    results = workdir / "results"
    assert not list(results.rglob("*.h5")) and not list(results.rglob("*.h5.partial"))
    assert sorted(p.name for p in (results / "activations").iterdir()) == [
        "held_out_tokens.json",
        "held_out_tokens.npy",
        "tokens.json",
        "tokens.npy",
    ]
    tokens = json.loads((results / "activations" / "tokens.json").read_text())
    total, per_context = config["sae"]["total_tokens"], tokens["context_length"] - 1
    held_out = config["sae"]["eval_contexts"]
    assert tokens["held_out_contexts"] == held_out
    assert tokens["n_contexts"] == -(-total // per_context) + held_out
    jobs = sorted(p.stem for p in (results / "benchmarks" / "train_sae_stream").glob("*.tsv"))
    assert jobs == ["resid_post_layer_0_to_1"]
    assert not (results / "benchmarks" / "train_sae").exists()
    assert not (results / "checkpoints" / "saes" / "stream").exists() or not any(
        (results / "checkpoints" / "saes" / "stream").iterdir()
    )
    for layer in (0, 1):
        sae_dir = results / "saes" / "resid_post" / f"layer_{layer}"
        assert {"cfg.json", "sae_weights.safetensors", "metrics.json"} <= {
            p.name for p in sae_dir.iterdir()
        }
        m = json.loads((sae_dir / "metrics.json").read_text())
        assert m["source"] == "stream" and m["tokens_trained"] == total
        assert m["hook_name"] == f"blocks.{layer}.hook_resid_post" and m["layer"] == layer
        assert m["explained_variance"] > 0.8 and m["ce_loss_recovered"] > 0.8, m
        s = m["stream"]
        assert s["members"] == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
        assert s["activation_bytes_written"] == 0 and s["stop_at_layer"] == 2
        # One pass through both layers a context: the training contexts once, all distinct
        # (the scaling estimate's batches, read again, add at most a few percent).
        assert s["epochs"] <= 1.0 and 1.0 <= s["forward_equivalents_per_context"] < 1.1, s
        assert s["contexts_forwarded"] >= s["training_contexts"] - 1


def test_the_streaming_job_memory_plan_is_within_25_percent(stream_run):
    """resources.job_peak_bytes of the group's job (what Slurm would be asked for, less its
    headroom) against the job's measured max_rss, as for every job of the default run."""
    workdir, _ = stream_run
    results = workdir / "results"
    config = cf_config.load(workdir / "config.yaml")
    (group,) = stream_groups.stream_groups(config)
    bench = results / "benchmarks" / "train_sae_stream" / f"{group.name}.tsv"
    measured = float(read_benchmark(bench)["max_rss"])
    log = (results / "logs" / "train_sae_stream" / f"{group.name}.log").read_text()
    peak = float(log.split("peak resident memory: ")[1].split(" MiB")[0])
    measured = max(measured, peak)
    planned = resources.job_peak_bytes(config, "train_sae_stream", "cpu", group.key) / 2**20
    assert 0.75 <= planned / measured <= 1.25, (planned, measured)
    assert "0 activation bytes written" in log


def test_attribution_and_interventions_run_on_the_streamed_saes(stream_run):
    workdir, config = stream_run
    results = workdir / "results"
    for behaviour in config["behaviours"]:
        features = pd.read_parquet(results / "attribution" / behaviour / "features.parquet")
        assert set(features["layer"]) == {0, 1}
        contexts = pd.read_parquet(results / "attribution" / behaviour / "feature_contexts.parquet")
        assert len(contexts) > 0 and set(contexts["layer"]) <= {0, 1}
        summary = json.loads((results / "interventions" / behaviour / "summary.json").read_text())
        assert summary
    costs = job_costs(results, config, list(config["behaviours"]), gpu_seen=False)
    row = costs[costs["rule"] == "train_sae_stream"].iloc[0]
    assert row["job"] == "resid_post_layer_0_to_1" and row["layer"] == 0
    # A rerun has nothing to do: the group's outputs and params are stable.
    done = run_snakemake({**config, "outdir": str(results)}, workdir, "-n", *targets(results))
    assert "Nothing to be done" in done.stdout + done.stderr, done.stdout[-2000:]
