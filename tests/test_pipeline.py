"""The real DAG, run through Snakemake's CLI: the model, prompts, baseline and provenance stages."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import TINY_EMBEDDED, read_json, run_snakemake
from safetensors.torch import load_file

from circuitflow.behaviours import PROMPT_COLUMNS, prompts_hash
from circuitflow.io import sha256_file
from circuitflow.models import load_model


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny-run")
    run_snakemake(TINY_EMBEDDED, workdir)
    return workdir / "results"


def test_dry_run_lists_the_rules(tmp_path):
    done = run_snakemake(TINY_EMBEDDED, tmp_path, "-n")
    for rule in ("train_model", "prompts", "baseline", "provenance", "all"):
        assert rule in done.stdout


def test_model_stage_writes_weights_tokenizer_and_model_json(tiny_run):
    info = read_json(tiny_run / "model" / "model.json")
    assert info["kind"] == "embedded"
    assert info["architecture"]["n_layers"] == 2
    assert info["weights_sha256"] == sha256_file(tiny_run / "model" / "weights.safetensors")
    assert info["training"]["steps"] == 150 and info["tokens_per_s"] > 0
    assert set(load_file(tiny_run / "model" / "weights.safetensors")) >= {
        "embed.W_E",
        "unembed.W_U",
    }
    model = load_model(tiny_run / "model", "cpu")
    assert model.tokenizer.decode([0]) == "<bos>"


def test_prompts_follow_the_contract(tiny_run):
    for behaviour in ("induction", "facts"):
        frame = pd.read_parquet(tiny_run / "prompts" / f"{behaviour}.parquet")
        assert list(frame.columns) == PROMPT_COLUMNS
        assert len(frame) == 24
        assert all(
            len(c) == len(k)
            for c, k in zip(frame.clean_tokens, frame.corrupted_tokens, strict=True)
        )
        assert frame.clean_text.str.len().min() > 0


def test_baseline_summary_and_rows(tiny_run):
    for behaviour in ("induction", "facts"):
        summary = read_json(tiny_run / "baseline" / f"{behaviour}.json")
        rows = pd.read_parquet(tiny_run / "baseline" / f"{behaviour}.parquet")
        prompts = pd.read_parquet(tiny_run / "prompts" / f"{behaviour}.parquet")
        assert summary["n_prompts"] == len(rows) == 24
        assert summary["prompts_sha256"] == prompts_hash(prompts)
        assert summary["logit_diff_mean"] == pytest.approx(rows.logit_diff.mean(), rel=1e-6)
        assert summary["accuracy"] == pytest.approx(rows.correct.mean())
        assert 0 <= summary["expected_calibration_error"] <= 1
        assert (tiny_run / "baseline" / f"{behaviour}_calibration.png").stat().st_size > 1000


def test_provenance_records_environment_and_resolved_config(tiny_run):
    env = read_json(tiny_run / "provenance" / "environment.json")
    assert env["packages"]["transformer-lens"] and env["packages"]["sae-lens"]
    assert env["torch"] and env["python"] and "commit" in env["pipeline_git"]
    resolved = (tiny_run / "provenance" / "config.resolved.yaml").read_text()
    assert "layers:\n- 0\n- 1" in resolved


def test_rerun_is_a_no_op_and_prompts_are_deterministic(tiny_run, tmp_path):
    before = sha256_file(tiny_run / "prompts" / "induction.parquet")
    done = run_snakemake({**TINY_EMBEDDED, "outdir": str(tiny_run)}, tmp_path, "-n")
    assert "Nothing to be done" in done.stdout + done.stderr
    assert sha256_file(tiny_run / "prompts" / "induction.parquet") == before
