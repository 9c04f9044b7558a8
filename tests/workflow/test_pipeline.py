"""The real DAG on the embedded default (`default_results`): the contracts of the model, prompts,
baseline and provenance stages, and a rerun that has nothing to do."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from helpers.dag import REPO, read_json, run_snakemake
from safetensors.torch import load_file

from circuitflow.io import sha256_file
from circuitflow.model.load import load_model
from circuitflow.prompts import PROMPT_COLUMNS, prompts_hash

pytestmark = pytest.mark.slow
DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
BEHAVIOURS = DEFAULT["behaviours"]


def test_dry_run_lists_the_rules(tmp_path, tiny_hf_model_dir):
    """The default run's rules, and with features.labeller naming a model (a dry run does not
    load it) the explainer's: its prefetch and a job per features group, which writes
    features/ from the features job's features_deterministic/."""
    done = run_snakemake({"features": {"labeller": str(tiny_hf_model_dir)}}, tmp_path, "-n")
    for rule in ("train_model", "prompts", "baseline", "provenance", "capture", "train_sae",
                 "held_out_tokens", "features_layers_0_to_1", "prefetch_explainer",
                 "explain_features_layers_0_to_1", "attribution", "interventions", "job_costs",
                 "all"):  # fmt: skip
        assert f"rule {rule}:" in done.stdout, rule
    assert f"{tmp_path}/results/features_deterministic/resid_post/layer_0" in done.stdout


def test_model_stage_writes_weights_tokenizer_and_model_json(default_results):
    info = read_json(default_results / "model" / "model.json")
    assert info["kind"] == "embedded"
    assert info["architecture"]["n_layers"] == 2
    assert info["architecture"]["active_heads"] == [2, 1]  # `auto` for two layers
    assert info["weights_sha256"] == sha256_file(default_results / "model" / "weights.safetensors")
    assert info["training"]["steps"] == DEFAULT["embedded"]["training"]["steps"]
    assert info["tokens_per_s"] > 0
    weights = load_file(default_results / "model" / "weights.safetensors")
    assert set(weights) >= {"embed.W_E", "unembed.W_U"}
    model = load_model(default_results / "model", "cpu")
    assert model.tokenizer.decode([0]) == "<bos>"


def test_prompts_follow_the_contract(default_results):
    for behaviour, spec in BEHAVIOURS.items():
        frame = pd.read_parquet(default_results / "prompts" / f"{behaviour}.parquet")
        assert list(frame.columns) == PROMPT_COLUMNS
        assert len(frame) == spec["n_prompts"]
        pairs = zip(frame.clean_tokens, frame.corrupted_tokens, strict=True)
        assert all(len(c) == len(k) for c, k in pairs)
        assert frame.clean_text.str.len().min() > 0


def test_baseline_summary_and_rows(default_results):
    for behaviour, spec in BEHAVIOURS.items():
        summary = read_json(default_results / "baseline" / f"{behaviour}.json")
        rows = pd.read_parquet(default_results / "baseline" / f"{behaviour}.parquet")
        prompts = pd.read_parquet(default_results / "prompts" / f"{behaviour}.parquet")
        assert summary["n_prompts"] == len(rows) == spec["n_prompts"]
        assert summary["prompts_sha256"] == prompts_hash(prompts)
        assert summary["logit_diff_mean"] == pytest.approx(rows.logit_diff.mean(), rel=1e-6)
        assert summary["accuracy"] == pytest.approx(rows.correct.mean())
        assert 0 <= summary["expected_calibration_error"] <= 1
        assert (default_results / "baseline" / f"{behaviour}_calibration.png").stat().st_size > 1000


def test_provenance_records_environment_and_resolved_config(default_results):
    env = read_json(default_results / "provenance" / "environment.json")
    assert env["packages"]["transformer-lens"] and env["packages"]["sae-lens"]
    assert env["torch"] and env["python"] and "commit" in env["pipeline_git"]
    resolved = (default_results / "provenance" / "config.resolved.yaml").read_text()
    assert "layers:\n- 0\n- 1" in resolved


def test_rerun_is_a_no_op(default_results, tmp_path):
    before = sha256_file(default_results / "prompts" / "induction.parquet")
    done = run_snakemake({"outdir": str(default_results)}, tmp_path, "-n")
    assert "Nothing to be done" in done.stdout + done.stderr
    assert sha256_file(default_results / "prompts" / "induction.parquet") == before


@pytest.fixture(scope="module")
def check_job(tmp_path_factory):
    """The `check` job, run by Snakemake with a caller's PYTHONPATH (a module loaded on CSD3
    often sets one) and model.hf_cache set: a sitecustomize on that path records, inside the
    stage job, its command line and the hub cache huggingface_hub reads. One run, two tests."""
    root = tmp_path_factory.mktemp("check-job")
    site = root / "site"
    site.mkdir()
    ran, seen = root / "ran.txt", root / "seen.txt"
    (site / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        "def record():\n"
        "    from huggingface_hub import constants\n"
        f"    open({str(ran)!r}, 'a').write(' '.join(sys.argv) + '\\n')\n"
        f"    open({str(seen)!r}, 'w').write(constants.HF_HUB_CACHE)\n"
        # Snakemake itself runs with this PYTHONPATH too: record only the stage job.
        "if sys.argv[0].endswith('check_env.py'):\n"
        "    atexit.register(record)\n"
    )
    cache = root / "hf cache"
    config = {"model": {"name": "embedded", "hf_cache": str(cache)}}
    run_snakemake(config, root / "run", "check", env={"PYTHONPATH": str(site)})
    return ran, seen, cache


def test_jobs_keep_the_callers_pythonpath(check_job):
    """A job's PYTHONPATH is the project's src/ followed by the caller's: the sitecustomize on
    the caller's path ran inside the `check` job."""
    ran, _, _ = check_job
    assert "check_env.py" in ran.read_text()


def test_jobs_see_model_hf_cache_as_their_hub_cache(check_job):
    """model.hf_cache is HF_HOME from the job's first line: huggingface_hub and transformers
    read it once, when imported, so setting it inside the stage would leave them on ~/.cache."""
    _, seen, cache = check_job
    assert seen.read_text() == str(cache / "hub")
