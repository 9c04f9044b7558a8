"""The run's description (circuitflow.description): every dictionary's real width and where it
came from, read by every plan that holds a dictionary, and one count of each stage's FLOPs that
the walltimes (circuitflow.resources) and the report's GPU-hours share."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from helpers.dag import REPO, profile_cluster
from safetensors.torch import save_file

from circuitflow import config as cf_config
from circuitflow import description, resources, stream_groups
from circuitflow.features import plan as features_plan
from circuitflow.model import architectures
from circuitflow.nodes import hook_name
from circuitflow.report import gpu_hours
from circuitflow.sae import pretrained_plan

READY = sorted((REPO / "config").glob("*.yaml"))
PUBLISHED = REPO / "config" / "gpt2-small-res-jb.yaml"


def write_dictionary(folder: Path, site: str, layer: int, d_in: int, d_sae: int) -> None:
    """A dictionary directory in SAELens's format as read_local checks it (the weights' names
    are what it reads of them)."""
    folder.mkdir(parents=True)
    cfg = {"d_in": d_in, "d_sae": d_sae, "metadata": {"hook_name": hook_name(site, layer)}}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file(
        {"W_enc": torch.zeros(1), "W_dec": torch.zeros(1)}, folder / "sae_weights.safetensors"
    )


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[dict, dict[int, int]]:
    """config/gpt2-small-res-jb.yaml on local dictionaries (`sae.pretrained.path`) whose widths
    are not `sae.expansion_factor` x d_model: layer 0's 2,304 latents, the others' 24,576."""
    config = cf_config.load(PUBLISHED)
    d_model = architectures.model_cfg(config).d_model
    root = tmp_path_factory.mktemp("published")
    widths = {layer: 3 * d_model if layer == 0 else 32 * d_model for layer in config["layers"]}
    for layer, width in widths.items():
        write_dictionary(root / "resid_pre" / f"layer_{layer}", "resid_pre", layer, d_model, width)
    config["sae"]["pretrained"] = {"path": str(root / "{site}" / "layer_{layer}")}
    assert all(w != config["sae"]["expansion_factor"] * d_model for w in widths.values())
    return config, widths


def trained_at(config: dict, d_sae: int | None) -> dict:
    """The same run with dictionaries trained at `d_sae` (None: the config's expansion)."""
    trained = copy.deepcopy(config)
    trained["sae"] = {**trained["sae"], "source": "capture", "d_sae": d_sae}
    return trained


def test_a_published_dictionary_is_described_at_its_own_width(published):
    config, widths = published
    run = description.describe(config)
    assert {d.layer: d.width for d in run.dictionaries} == widths
    assert run.widths_known and run.spliced_width == max(widths.values())
    assert run.dictionary("resid_pre", 0).width_from.endswith("resid_pre/layer_0/cfg.json")
    configured = description.describe(trained_at(config, None))
    assert configured.widest() == config["sae"]["expansion_factor"] * run.model.d_model


def test_splicing_stages_plan_published_dictionaries_at_their_width(published):
    """Attribution and interventions plan a published run as the same run trained at the
    dictionaries' (widest) width, not at `sae.expansion_factor` x d_model: their work, and
    attribution's memory (the interventions' plan holds no dictionary: a forward pass's)."""
    config, widths = published
    same = trained_at(config, max(widths.values()))
    configured = trained_at(config, None)
    plans = {
        "attribution work": lambda c: resources.job_work(c, "attribution", "ioi").flops,
        "attribution memory": lambda c: resources.job_peak_bytes(c, "attribution", "cpu"),
        "interventions work": lambda c: resources.job_work(c, "interventions", "ioi").flops,
    }
    for name, plan in plans.items():
        assert plan(config) == plan(same), name
        assert plan(config) != plan(configured), name


def test_pretrained_jobs_plan_each_dictionary_at_its_width(published):
    """A pretrained_sae job's work grows by the encoder and decoder of its dictionary's own
    width (ENCODES x 4 d_model d_sae a position of each context), its memory by the widest
    member's parameters."""
    config, widths = published
    d, t = 768, description.describe(config).context_length
    n = config["sae"]["eval_contexts"]

    def flops(job: str) -> float:
        return resources.job_work(config, "pretrained_sae", job).flops["float32"]

    # resid_pre at layers 0 and 1 as one job, against two jobs: the same model passes.
    both, first, second = (
        flops("resid_pre:0,resid_pre:1"),
        flops("resid_pre:0"),
        flops("resid_pre:1"),
    )
    assert both == pytest.approx(first + second, rel=1e-12)
    encodes = pretrained_plan.ENCODES * 4.0 * d * n * t
    model_passes = first - encodes * widths[0]
    second_passes = second - encodes * widths[1]
    # Layer 1's model passes go one layer deeper than layer 0's: the rest is the width.
    assert 0 < second_passes - model_passes < 0.2 * model_passes
    one = pretrained_plan.job_bytes(config, "prefetch_saes", "cpu")
    assert one == 2 * (2 * d * max(widths.values()) + 2 * max(widths.values()) + d) * 4
    small = pretrained_plan.job_bytes(config, "pretrained_sae", "cpu", "resid_pre:0")
    wide = pretrained_plan.job_bytes(config, "pretrained_sae", "cpu", "resid_pre:0,resid_pre:1")
    assert wide - small >= 2 * d * (widths[1] - widths[0]) * 4


def test_a_release_not_fetched_yet_is_planned_again_once_it_is(tmp_path):
    """Before prefetch_saes the release's width is the config's (and said so); once its
    cfg.json is in the cache the description says its own width, not the one kept before."""
    config = cf_config.load(PUBLISHED)
    config["model"]["hf_cache"] = str(tmp_path)
    config["layers"] = [0]
    before = description.describe(config)
    assert not before.widths_known
    assert before.widest() == config["sae"]["expansion_factor"] * 768
    assert "not readable yet" in before.dictionary("resid_pre", 0).width_from
    repo = tmp_path / "hub" / "models--jbloom--GPT2-Small-SAEs-Reformatted"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    folder = repo / "snapshots" / commit / "blocks.0.hook_resid_pre"
    folder.mkdir(parents=True)
    (folder / "cfg.json").write_text(json.dumps({"d_in": 768, "d_sae": 24576}))
    after = description.describe(config)
    assert after.widths_known and after.widest() == 24576
    assert "Hugging Face cache" in after.dictionary("resid_pre", 0).width_from


H200_SUITE = REPO / "benchmarks" / "results" / "gpu_suite-nvidia-h200-cuda.json"


def scheduled_jobs(config: dict, cluster) -> dict[str, tuple[str, list]]:
    """Each GPU stage's rule and jobs (as resources.job_work takes them) as the workflow
    schedules them (workflow/rules/*.smk): the baseline, attribution and interventions per
    behaviour (attribution and interventions where SAEs are spliced), one capture and one
    train_sae job per dictionary, or the grouped streaming or published dictionaries' jobs."""
    behaviours = list(config["behaviours"])
    run = description.describe(config)
    jobs = {"baseline": ("baseline", behaviours)}
    source = config["sae"]["source"]
    shards = config["capture"]["shards"]
    if source == "capture":
        jobs["capture"] = ("capture", [None]) if shards == 1 else ("capture_shard", [None] * shards)
        jobs["train_sae"] = ("train_sae", [(d.site, d.layer) for d in run.dictionaries])
    else:
        rule = "train_sae_stream" if source == "stream" else "pretrained_sae"
        groups = stream_groups.stream_groups(config, cluster, on_gpu=True)
        jobs[rule] = (rule, [g.key for g in groups])
    if run.transcoders:
        jobs["transcoder_replacement"] = ("transcoder_replacement", [None])
    if run.spliced:
        jobs["attribution"] = ("attribution", behaviours)
    if run.transcoders and config["attribution"]["prompt_graphs"]:
        jobs["prompt_graphs"] = ("prompt_graphs", behaviours)
    if run.spliced:
        jobs["interventions"] = ("interventions", behaviours)
    # workflow/rules/features.smk: a features job per group of layers, every dictionary's.
    jobs["features"] = ("features", [g.key for g in features_plan.groups(config)])
    return jobs


def transcoders_in_shards(config: dict) -> dict:
    """The run with SAEs and transcoders (sae.kind both) captured in two shards."""
    config = copy.deepcopy(config)
    config["sae"] = {**config["sae"], "source": "capture", "kind": "both"}
    config["capture"] = {**config["capture"], "shards": 2}
    config["attribution"] = {**config["attribution"], "prompt_graphs": 2}
    return config


VARIANTS = {"as written": lambda c: c, "transcoders in shards": transcoders_in_shards}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("path", READY, ids=lambda p: p.name)
def test_walltimes_and_gpu_hours_count_the_same_flops(path, variant):
    """For every ready config, each row of the report's GPU-hours counts the FLOPs (by dtype)
    that the walltimes of its stage's jobs count (resources.job_work, every job the workflow
    schedules), and for a model the GPU suite covers, the estimate's table charges them: the
    two paths differ only in the rate they apply. Also with transcoders captured in shards,
    whose rules no ready config runs."""
    config = VARIANTS[variant](cf_config.load(path))
    cluster = profile_cluster("csd3")
    want = {}
    for stage, (rule, jobs) in scheduled_jobs(config, cluster).items():
        flops: dict[str, float] = {}
        for job in jobs:
            arg = None if isinstance(job, tuple) else job  # train_sae plans any dictionary's
            for dtype, f in resources.job_work(config, rule, arg).flops.items():
                flops[dtype] = flops.get(dtype, 0.0) + f
        want[stage] = (len(jobs), flops)
    rows = gpu_hours.planned_rows(config, cluster)
    got = {row.stage: (len(row.jobs), row.flops(config)) for row in rows}
    assert got.keys() == want.keys()
    for stage, (n_jobs, flops) in want.items():
        assert got[stage][0] == n_jobs, stage
        assert got[stage][1].keys() == flops.keys(), stage
        for dtype, f in flops.items():
            assert got[stage][1][dtype] == pytest.approx(f, rel=1e-12), (stage, dtype)
    if architectures.architecture_key(config["model"]["name"]) is None:
        return  # the GPU suite does not cover the model: no table
    suite = gpu_hours.load_suite(H200_SUITE)
    table = gpu_hours.estimate(suite, config, gpu="A100", cluster=cluster).set_index("stage")
    assert list(table.index) == [*want, "total"]
    for stage, (n_jobs, flops) in want.items():
        assert table.loc[stage, "jobs"] == n_jobs
        assert table.loc[stage, "pflop"] * 1e15 == pytest.approx(sum(flops.values()), rel=1e-9)


def test_prompt_graphs_plan_each_transcoders_own_k(published, tmp_path):
    """The per-prompt graphs' features are planned from each transcoder's active latents as the
    description states them: a published one's k from its cfg.json (here 24 and 40, not the
    config's `sae.k`), a trained one's `sae.k` (TopK) or twice `sae.target_l0`."""
    from circuitflow.attribution.prompt_graphs import plan

    config = copy.deepcopy(published[0]) | {"layers": [0, 1], "sites": ["mlp_out"]}
    config["sae"] = {**config["sae"], "kind": "transcoder", "k": 16, "target_l0": 10}
    d_model = architectures.model_cfg(config).d_model
    ks = {0: 24, 1: 40}
    for layer, k in ks.items():
        folder = tmp_path / "mlp_out" / f"layer_{layer}"
        write_dictionary(folder, "mlp_out", layer, d_model, 4 * d_model)
        cfg = json.loads((folder / "cfg.json").read_text())
        (folder / "cfg.json").write_text(json.dumps(cfg | {"architecture": "topk", "k": k}))
    config["sae"]["pretrained"] = {"path": str(tmp_path / "{site}" / "layer_{layer}")}
    run = description.describe(config)
    assert [(d.kind, d.active) for d in run.transcoders] == [("transcoder", 24), ("transcoder", 40)]
    assert run.transcoders[1].active_from.endswith("mlp_out/layer_1/cfg.json")
    assert plan.active_features(config, 5) == (24 + 40) * 5
    # The features stage plans each group's firings from the same k, not a share of the width.
    from circuitflow.features import plan as features_plan

    layer_0 = features_plan.FeatureGroup((("mlp_out", 0),))
    assert features_plan.firing_per_token(config, 4 * d_model, layer_0) == 24
    assert features_plan.firing_per_token(config, 4 * d_model) == 40
    assert features_plan.firing_per_token(config, 30, layer_0) == 24
    assert features_plan.firing_per_token(config, 20, layer_0) == 20  # at most the width
    trained = trained_at(config, None)
    assert plan.active_features(trained, 5) == 2 * 16 * 5
    trained["sae"]["architecture"] = "jumprelu"
    assert plan.active_features(trained, 5) == 2 * 2 * 10 * 5


def test_a_release_that_states_no_k_is_planned_at_twice_its_listed_l0(tmp_path):
    """Gemma Scope 2's JumpReLU transcoders state no k: before and after the prefetch they are
    planned at twice the L0 SAELens's pretrained_saes.yaml lists for each id (read here from
    the installed file itself), not at the config's 2 x sae.target_l0."""
    import importlib.util
    import math

    import yaml

    config = cf_config.load(REPO / "config" / "gemma-3-270m-transcoders.yaml")
    config["model"]["hf_cache"] = str(tmp_path)  # an empty cache: nothing fetched
    spec = importlib.util.find_spec("sae_lens")
    listed = yaml.safe_load(
        (Path(next(iter(spec.submodule_search_locations))) / "pretrained_saes.yaml").read_text()
    )
    saes = {s["id"]: s for s in listed[config["sae"]["pretrained"]["release"]]["saes"]}
    run = description.describe(config)
    assert len(run.transcoders) == 18
    want = [
        math.ceil(2 * saes[config["sae"]["pretrained"]["sae_id"].format(layer=d.layer)]["l0"])
        for d in run.transcoders
    ]
    assert [d.active for d in run.transcoders] == want
    assert set(want) != {2 * config["sae"]["target_l0"]}  # not the config's plan
    assert all(d.active_from.endswith("listed L0") for d in run.transcoders)
