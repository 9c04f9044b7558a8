"""sae.source pretrained through the real DAG (Snakemake's CLI) on the embedded model at the tiny
settings (.test/config/tiny.yaml): published dictionaries built here in SAELens's format
(tests/helpers/dictionaries.py) used instead of trained ones, at site resid_pre, which the
pipeline trains by default nowhere: a local directory template through attribution and
interventions, its two dictionaries evaluated by one job (`sae.stream.layers_per_job: 2`), and a
release fetched by the prefetch_saes localrule from a Hugging Face cache laid out on disk, its
jobs offline, one per dictionary (`auto` on the embedded model). No capture, no training, no
download."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from helpers.dag import load_test_config, place_model, read_json, run_snakemake
from helpers.dictionaries import REVISION, build, lay_out_cache, save
from sae_lens import SAE

from circuitflow.report.job_costs import job_costs

pytestmark = pytest.mark.slow
D_MODEL = 64  # the embedded model's (config/config.yaml)
N_DEAD = 2
REPO_ID = "circuitflow-test/embedded-saes"


def tiny(pretrained: dict, outdir, **sae) -> dict:
    config = load_test_config("tiny")
    config["sites"] = ["resid_pre"]
    # One behaviour: what these tests check is per dictionary, not per behaviour (suite time).
    config["behaviours"] = {"induction": config["behaviours"]["induction"]}
    config["sae"] = {"source": "pretrained", "pretrained": pretrained, "eval_contexts": 16, **sae}
    return {"outdir": str(outdir), **config}


def dictionaries() -> dict[int, object]:
    """Layer 0: a standard SAE that reconstructs exactly (and N_DEAD latents that never fire);
    layer 1: a TopK one."""
    return {
        0: build("standard", D_MODEL, "blocks.0.hook_resid_pre", "embedded", n_dead=N_DEAD),
        1: build("topk", D_MODEL, "blocks.1.hook_resid_pre", "embedded", k=8, seed=1),
    }


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(bool((sa[k] == sb[k]).all()) for k in sa)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_model):
    """The DAG to interventions with `sae.pretrained.path` naming dictionaries on disk, both
    evaluated by one job, with the SAE table and the resolved config; not the rest of the
    report's small jobs (the default run tests those rules; suite time)."""
    root = tmp_path_factory.mktemp("pretrained-local")
    saes = dictionaries()
    for layer, sae in saes.items():
        save(sae, root / "dicts" / "resid_pre" / f"layer_{layer}")
    pre = {"path": str(root / "dicts" / "{site}" / "layer_{layer}")}
    config = tiny(pre, root / "results", stream={"layers_per_job": 2})
    results = root / "results"
    place_model(tiny_model, config, results)
    targets = [results / "interventions" / "induction" / "summary.json"]
    targets += [results / "report" / "sae_metrics.csv"]
    targets += [results / "provenance" / "config.resolved.yaml"]
    done = run_snakemake(config, root, *map(str, targets), prefork=True)
    return results, saes, done, config


def test_the_dag_uses_the_dictionaries_instead_of_capture_and_training(local_run):
    results, saes, done, _ = local_run
    jobs = done.stdout + done.stderr
    assert jobs.count("rule pretrained_sae_") == 1  # one job for both dictionaries
    assert "rule pretrained_sae_resid_pre_layer_0_to_1:" in jobs
    for rule in ("rule capture:", "rule train_sae:", "prefetch_saes"):
        assert rule not in jobs, rule
    assert sorted(p.name for p in (results / "activations").iterdir()) == [
        "held_out_tokens.json",
        "held_out_tokens.npy",
        "tokens.json",
        "tokens.npy",
    ]  # the token set only: no activation file
    for layer, source in saes.items():
        out = results / "saes" / "resid_pre" / f"layer_{layer}"
        assert same_weights(SAE.load_from_disk(out), source)
        metrics = read_json(out / "metrics.json")
        assert metrics["source"] == "pretrained" and metrics["tokens_trained"] == 0
        assert metrics["hook_name"] == f"blocks.{layer}.hook_resid_pre"
        assert metrics["eval_contexts"] == 16 and metrics["eval_tokens"] > 0
    exact = read_json(results / "saes" / "resid_pre" / "layer_0" / "metrics.json")
    assert exact["explained_variance"] == pytest.approx(1.0, abs=1e-5)
    assert exact["ce_loss_recovered"] == pytest.approx(1.0, abs=1e-4)
    assert exact["dead_fraction"] == pytest.approx(N_DEAD / (2 * D_MODEL + N_DEAD))
    topk = read_json(results / "saes" / "resid_pre" / "layer_1" / "metrics.json")
    assert 0 < topk["l0"] <= 8 and topk["architecture"] == "topk"


def test_attribution_and_interventions_run_on_the_published_dictionaries(local_run):
    results, saes, _, config = local_run
    for behaviour in ("induction",):
        features = pd.read_parquet(results / "attribution" / behaviour / "features.parquet")
        assert set(features.site) == {"resid_pre"} and set(features.layer) <= {0, 1}
        for layer, sae in saes.items():
            assert (features[features.layer == layer].feature < sae.cfg.d_sae).all()
        contexts = pd.read_parquet(results / "attribution" / behaviour / "feature_contexts.parquet")
        assert len(contexts) > 0 and set(contexts.site) == {"resid_pre"}
        graph = read_json(results / "attribution" / behaviour / "graph.json")
        assert any(n["id"].startswith("feature.resid_pre.") for n in graph["nodes"])
        summary = read_json(results / "interventions" / behaviour / "summary.json")
        assert summary["behaviour"] == behaviour and summary["n_nodes"] > 0
        assert (results / "interventions" / behaviour / "features.parquet").is_file()
    table = pd.read_csv(results / "report" / "sae_metrics.csv")
    assert list(table.tokens_trained) == [0, 0] and set(table.site) == {"resid_pre"}
    costs = job_costs(results, config, list(config["behaviours"]), gpu_seen=False)
    evaluated = costs[costs.rule == "pretrained_sae"]
    assert list(evaluated.job) == ["resid_pre_layer_0_to_1"]  # its first member's count:
    assert (evaluated.forward_equivalents_per_prompt > 3).all()  # 3 passes and the firing one


def test_a_release_is_prefetched_by_a_localrule_and_loaded_offline(tiny_model, tmp_path):
    """A release in a Hugging Face cache laid out on disk (model.hf_cache), the hub offline
    throughout: prefetch_saes lists it, each pretrained_sae job loads its dictionary from the
    cache and writes it unchanged."""
    saes = dictionaries()
    lay_out_cache(
        tmp_path / "hf" / "hub",
        REPO_ID,
        {f"resid_pre/layer_{layer}": sae for layer, sae in saes.items()},
    )
    config = tiny({"release": REPO_ID, "sae_id": "{site}/layer_{layer}"}, tmp_path / "results")
    config["model"] = {"hf_cache": str(tmp_path / "hf")}
    place_model(tiny_model, config, tmp_path / "results")
    targets = [
        str(tmp_path / "results" / "saes" / "resid_pre" / f"layer_{layer}") for layer in saes
    ]
    done = run_snakemake(config, tmp_path, *targets, env={"HF_HUB_OFFLINE": "1"}, prefork=True)
    jobs = done.stdout + done.stderr
    assert "localrule prefetch_saes:" in jobs and jobs.count("rule pretrained_sae_") == 2
    assert "rule train_model:" not in jobs
    assert "rule pretrained_sae_resid_pre_layer_1:" in jobs  # one job each (auto, embedded)
    prefetch = read_json(tmp_path / "results" / "pretrained" / "prefetch.json")
    assert prefetch["hub_cache"] == str(tmp_path / "hf" / "hub")
    assert [(r["layer"], r["revision"]) for r in prefetch["dictionaries"]] == [
        (0, REVISION),
        (1, REVISION),
    ]
    for layer, source in saes.items():
        out = tmp_path / "results" / "saes" / "resid_pre" / f"layer_{layer}"
        assert same_weights(SAE.load_from_disk(out), source)
        metrics = read_json(out / "metrics.json")
        assert (metrics["release"], metrics["repo_id"], metrics["revision"]) == (
            REPO_ID,
            REPO_ID,
            REVISION,
        )


def test_a_dictionary_that_does_not_fit_stops_the_run_before_any_job(tmp_path):
    sae = build("standard", 32, "blocks.0.hook_resid_pre", "embedded")
    for layer in (0, 1):
        save(sae, tmp_path / "dicts" / "resid_pre" / f"layer_{layer}")
    config = tiny({"path": str(tmp_path / "dicts" / "{site}" / "layer_{layer}")}, tmp_path / "r")
    done = run_snakemake(config, tmp_path, "-n", check=False)
    assert done.returncode != 0
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "config error:" in ln]
    layer0 = tmp_path / "dicts" / "resid_pre" / "layer_0"
    assert lines == [
        f"config error: sae.pretrained.path: {layer0}: d_in 32 is not the model's d_model 64"
    ], done.stdout + done.stderr
    assert not (tmp_path / "r").exists()


def test_the_config_keeps_its_templates_through_the_rules(local_run):
    """Braces in sae.pretrained's templates are not taken for wildcards: the resolved config
    the provenance rule writes holds the template as given."""
    results = local_run[0]
    resolved = yaml.safe_load((results / "provenance" / "config.resolved.yaml").read_text())
    assert resolved["sae"]["pretrained"]["path"].endswith("dicts/{site}/layer_{layer}")
    assert resolved["sae"]["source"] == "pretrained"
