"""Per-rule job resources (src/circuitflow/resources.py): GPUs, CPUs, memory, walltime."""

from __future__ import annotations

import copy
import math

import pytest
import yaml
from helpers.dag import REPO, profile_cluster

from circuitflow import config as cf_config
from circuitflow import resources
from circuitflow.cluster import Cluster, setting_value
from circuitflow.errors import ConfigError
from circuitflow.model import architectures

EMBEDDED = cf_config.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))


def _real(name: str, n_layers: int) -> dict:
    cfg = copy.deepcopy(EMBEDDED)
    cfg["model"] = {**cfg["model"], "name": name, "n_layers": n_layers}
    return cfg


def test_parameter_counts_are_those_of_the_built_models():
    """architectures.n_params against HookedTransformers built from the same configs (2 layers
    and a small vocabulary, so they build fast): gated MLP and grouped-query attention count."""
    from transformer_lens import HookedTransformer

    for name in architectures.ARCHITECTURES:
        cfg = architectures.config(name, n_layers=2, d_vocab=1000)
        built = sum(p.numel() for p in HookedTransformer(cfg).parameters())
        assert architectures.n_params(cfg) == built, name


def test_model_shape_of_every_kind_of_model(tiny_hf_model_dir):
    assert architectures.model_shape(EMBEDDED).d_model == 64
    for name, key in (("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b"), ("gpt2", "gpt2-small")):
        shape = architectures.model_shape(_real(name, 24))
        assert shape.n_params == architectures.n_params(architectures.config(key)), name
    # Qwen2.5-0.5B as loaded (untied unembedding): 630.5M, not the 558.5M that ignored the
    # gated MLP and grouped-query attention.
    assert architectures.model_shape(_real("Qwen/Qwen2.5-0.5B", 24)).n_params == 630_479_104
    local = architectures.model_shape(_real(str(tiny_hf_model_dir), 2))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_hf_model_dir)
    assert (local.n_layers, local.d_model) == (2, 32)
    # The HF model ties its unembedding; TransformerLens loads it untied, as counted here.
    tied = sum(p.numel() for p in hf.parameters())
    assert local.n_params == tied + hf.config.vocab_size * hf.config.n_embd + hf.config.vocab_size


def test_qwen_capture_needs_more_than_embedded():
    qwen = _real("Qwen/Qwen2.5-0.5B", 24)
    for rule in ("capture", "train_sae", "baseline"):
        assert resources.mem_mb(qwen, rule) > resources.mem_mb(EMBEDDED, rule)
        assert resources.runtime(qwen, rule) >= resources.runtime(EMBEDDED, rule)


def test_retries_get_more_memory_and_walltime_within_the_cap():
    for rule in ("train_sae", "capture", "prompts"):
        assert resources.mem_mb(EMBEDDED, rule, 2) == 2 * resources.mem_mb(EMBEDDED, rule, 1)
        assert resources.runtime(EMBEDDED, rule, 2) > resources.runtime(EMBEDDED, rule, 1)
    big = _real("gpt2", 12)
    big["sae"] = {**big["sae"], "total_tokens": 10**10}
    sl3 = Cluster(max_runtime=720)
    assert resources.runtime(big, "train_sae", 3, sl3) == 720
    # Its attempts cover its work: 10^10 tokens need more than SL3's default retries.
    assert resources.retries(big, "train_sae", sl3) > sl3.resumable_retries
    # A job that resumes from checkpoints starts with a few hours at most and grows on retries.
    first = resources.runtime(big, "train_sae", 1)
    assert first == Cluster().resumable_max_runtime
    assert resources.runtime(big, "train_sae", 2) == 2 * first


def test_walltime_follows_the_counted_work():
    """The work part of a walltime grows with the work: SAE tokens, the SAE's width (the FLOPs
    per token are 12 d_in d_sae), prompts; a lower share of the peak means longer."""
    gpt2 = _real("gpt2", 12)
    gpt2["sae"]["total_tokens"] = 10**8  # the SAE's evaluation, a constant, is then < 1%
    cluster = Cluster(startup_minutes=0, resumable_max_runtime=10**6)

    def minutes(cfg: dict, rule: str, c: Cluster = cluster) -> float:
        return resources.work_seconds(cfg, rule, c) / 60

    base = minutes(gpt2, "train_sae")
    more = copy.deepcopy(gpt2)
    more["sae"]["total_tokens"] *= 4
    assert minutes(more, "train_sae") == pytest.approx(4 * base, rel=0.01)
    # The SAE's FLOPs alone at 5% of an A100's TF32 peak: 12 d_in d_sae per token.
    d_sae = gpt2["sae"]["expansion_factor"] * 768
    flops = gpt2["sae"]["total_tokens"] * 12 * 768 * d_sae
    assert base * 60 >= flops / (0.05 * 156e12)
    slower = Cluster(startup_minutes=0, gpu_peak_percent=2.5)
    assert minutes(gpt2, "attribution", slower) == pytest.approx(
        2 * minutes(gpt2, "attribution"), rel=1e-6
    )
    prompts = copy.deepcopy(gpt2)
    prompts["behaviours"] = {"b": {"source": "ioi", "n_prompts": 1024}}
    gpt2["behaviours"] = {"b": {"source": "ioi", "n_prompts": 256}}
    assert minutes(prompts, "baseline") == pytest.approx(4 * minutes(gpt2, "baseline"))
    # Start-up is added once per job, in whole minutes.
    assert resources.runtime(gpt2, "baseline") == math.ceil(10 + minutes(gpt2, "baseline"))


READY = {name: REPO / "config" / f"{name}.yaml" for name in ("gpt2-small", "qwen2.5-0.5b")}
SUITE = REPO / "benchmarks" / "results" / "cpu.json"
STAGE_RULES = {
    "baseline": "baseline",
    "train_sae_stream": "train_sae_stream",  # the ready configs stream (sae.source)
    "attribution": "attribution",
    "interventions": "interventions",
}


def csd3_cluster() -> Cluster:
    return profile_cluster("csd3")


@pytest.mark.parametrize("name", sorted(READY))
def test_first_attempts_of_the_ready_configs_fit_their_work(name):
    """On the CSD3 profile no first attempt asks for more than 6 hours, and every GPU job asks
    for at least 3x the project's own projection of its time (report/gpu_hours.py, from the
    rates the GPU suite measured: benchmarks/results/cpu.json); a job that resumes from its
    checkpoints (the streaming SAE jobs, which train 300M tokens a layer) over its attempts
    (the profile's retries)."""
    from circuitflow import stream_groups
    from circuitflow.report import gpu_hours

    config = cf_config.load(READY[name])
    cluster = csd3_cluster()
    assert cluster.gpu_type == "A100" and cluster.max_runtime == 2160
    projected = gpu_hours.estimate(gpu_hours.load_suite(SUITE), config).set_index("stage")
    prompts = {b: spec["n_prompts"] for b, spec in config["behaviours"].items()}
    groups = stream_groups.stream_groups(config, cluster)
    for stage, rule in STAGE_RULES.items():
        row = projected.loc[stage]
        jobs = {b: n / sum(prompts.values()) for b, n in prompts.items()}
        if rule == "train_sae_stream":  # the projection's share of each group: its SAEs
            n_saes = sum(len(g.members) for g in groups)
            jobs = {g.key: len(g.members) / n_saes for g in groups}
        for job, share in jobs.items():
            minutes = resources.runtime(config, rule, 1, cluster, job)
            own = row["gpu_hours"] * share * 60
            assert minutes <= 6 * 60, (rule, job, minutes)
            if resources.RULES[rule].resumable:
                attempts = 1 + resources.retries(config, rule, cluster, job)
                minutes = sum(resources.runtime(config, rule, a, cluster, job)
                              for a in range(1, attempts + 1))  # fmt: skip
            assert minutes >= 3 * own, (rule, job, minutes, own)
    for rule in ("prompts", "capture_tokens", "provenance", "job_costs"):
        assert resources.runtime(config, rule, 1, cluster) <= 6 * 60


def test_accounts_are_refused_with_one_line(monkeypatch):
    """The CSD3 profile builds both accounts from $CSD3_ACCOUNT: unset, or set with the -GPU
    suffix `mybalance` prints, is refused in one line that says what to set."""

    def problem(account: str | None) -> str | None:
        if account is None:
            monkeypatch.delenv("CSD3_ACCOUNT", raising=False)
        else:
            monkeypatch.setenv("CSD3_ACCOUNT", account)
        return csd3_cluster().account_problem()

    assert problem("PROJ-SL2") is None
    doubled = problem("PROJ-SL2-GPU")
    assert "CSD3_ACCOUNT=PROJ-SL2 " in doubled and "\n" not in doubled
    assert "CSD3_ACCOUNT=PROJ-SL2 " in problem("PROJ-SL2-gpu")
    for unset in ("", None):
        assert "export CSD3_ACCOUNT" in problem(unset)
    # A profile that names its account outright has no variable to name.
    literal = Cluster.from_profile({"slurm_account": "'lab-gpu-GPU'"})
    assert "edit slurm_account in your profile" in literal.account_problem()
    assert Cluster.from_profile({}).account_problem() is None  # sbatch's default account


def test_profile_settings_are_parsed_like_yaml_values(monkeypatch):
    monkeypatch.setenv("CSD3_ACCOUNT", "PROJ-SL3")
    assert setting_value("'${CSD3_ACCOUNT}-GPU'") == "PROJ-SL3-GPU"
    assert setting_value("50") == 50 and setting_value(240) == 240
    cluster = Cluster.from_profile({"gpu_type": "'H100'", "gpu_peak_percent": "10"})
    assert (cluster.gpu_type, cluster.peak_share, cluster.startup_minutes) == ("H100", 0.1, 10)
    assert csd3_cluster().gpu_job_account() == "PROJ-SL3-GPU"


def test_gpus_and_cpus():
    assert resources.gpus(EMBEDDED, "train_sae") == 1
    assert resources.gpus(EMBEDDED, "prompts") == 0
    assert resources.gpus({**EMBEDDED, "device": "cpu"}, "train_sae") == 0
    gpt2 = _real("gpt2", 12)
    for rule in resources.RULES:
        n = resources.threads(gpt2, rule)
        assert 1 <= n <= Cluster().cpus_per_gpu * max(1, resources.gpus(gpt2, rule))


def test_every_rule_of_the_workflow_is_in_the_table():
    """Each rule that asks for job resources or threads names a row of the rule table, and every
    row is a rule the workflow has (a new rule is one line in resources.RULES). A rule defined
    once per job in a loop (`rule:` with `name: f"train_sae_stream_{group.name}"`) counts as
    its name's fixed part, which its resources name."""
    import re

    text = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    asked = set(re.findall(r'job_(?:resources|threads)\("(\w+)"', text))
    declared = set(re.findall(r"^\s*rule (\w+):", text, re.M))
    declared |= set(re.findall(r'^\s*name:\s*f"(\w+)_\{', text, re.M))
    assert asked <= set(resources.RULES), asked - set(resources.RULES)
    assert set(resources.RULES) <= declared, set(resources.RULES) - declared
    assert set(resources.CLASSES) == {r.resource_class for r in resources.RULES.values()}


def test_job_plans_honour_the_model_dtype():
    """model.dtype: float32 on a GPU plans fp32 weights and activations: more host memory for
    the jobs that hold the model than bf16 (`auto` plans 16-bit on a GPU), the same on a CPU
    for auto and float32, and a walltime at the GPU's fp32 rate. (A real model's load, three
    fp32 copies on the host, outweighs its weights in these jobs: the embedded model shows the
    plan's dtype.)"""

    def with_dtype(config: dict, dtype: str) -> dict:
        out = copy.deepcopy(config)
        out["model"]["dtype"] = dtype
        return out

    f32, bf16 = with_dtype(EMBEDDED, "float32"), with_dtype(EMBEDDED, "bfloat16")
    # On a GPU the host holds the model only while it loads (baseline's plan is the model):
    # the other stages' host share is their buffers, whatever the model's dtype.
    auto = resources.job_peak_bytes(EMBEDDED, "baseline", "cuda")
    assert auto == resources.job_peak_bytes(bf16, "baseline", "cuda")
    weights = resources.job_peak_bytes(f32, "baseline", "cuda") - auto
    n_params = architectures.n_params(architectures.model_cfg(EMBEDDED))
    assert weights == 2 * n_params  # 4 bytes a parameter, not 2
    for rule in ("baseline", "capture", "train_sae", "attribution"):
        on_cpu = resources.job_peak_bytes(f32, rule, "cpu")
        assert on_cpu == resources.job_peak_bytes(EMBEDDED, rule, "cpu"), rule
    # Walltime: fp32 runs at half the A100's bf16 rate (156 against 312 TFLOP/s).
    gpt2 = _real("gpt2", 12)
    idle = Cluster(startup_minutes=0)
    slow = resources.work_seconds(with_dtype(gpt2, "float32"), "baseline", idle)
    assert slow == pytest.approx(2 * resources.work_seconds(gpt2, "baseline", idle))


def test_an_unknown_gpu_type_is_refused():
    with pytest.raises(ConfigError, match="gpu_type: 'B300'.*allowed values: A100, H100"):
        Cluster.from_profile({"gpu_type": "'B300'"})


RESUMABLE = [name for name, rule in resources.RULES.items() if rule.resumable]


def jobs_of(config: dict, rule: str, cluster: Cluster) -> list[str | None]:
    from circuitflow import stream_groups

    if rule == "train_sae_stream":
        if config["sae"]["source"] != "stream":
            return []
        return [g.key for g in stream_groups.stream_groups(config, cluster)]
    return [None]


@pytest.mark.parametrize("kind", [None, "both"])
@pytest.mark.parametrize("name", sorted([*READY, "gpt2-small-res-jb"]))
def test_resumable_attempts_cover_their_planned_work(name, kind):
    """On the CSD3 profile every job that resumes from checkpoints gets enough attempts (its
    retries) that their walltimes, each less its start-up, add up to its planned work: the
    streaming jobs of 30 hours got 4 + 8 + 12 hours before (issue 40). Where walltime is not
    capped (a workstation) the profile's retries stand."""
    config = cf_config.load(REPO / "config" / f"{name}.yaml")
    if kind and config["sae"]["source"] != "pretrained":
        config["sae"]["kind"] = kind
        config = cf_config.resolve(config)
    cluster = csd3_cluster()
    checked = 0
    for rule in RESUMABLE:
        for job in jobs_of(config, rule, cluster):
            work = resources.work_seconds(config, rule, cluster, job) / 60
            n = 1 + resources.retries(config, rule, cluster, job)
            walltimes = [resources.runtime(config, rule, a, cluster, job) for a in range(1, n + 1)]
            assert all(w <= cluster.max_runtime for w in walltimes)
            assert sum(w - cluster.startup_minutes for w in walltimes) >= work, (rule, job)
            assert n >= 1 + cluster.resumable_retries
            checked += 1
        assert resources.retries(config, rule, Cluster()) is None
    assert checked >= 2


def test_walltimes_read_the_rates_measured_on_the_profiles_gpu(tmp_path):
    """A profile whose gpu_type the GPU suite measured (benchmarks/results/
    gpu_suite-nvidia-h200-cuda.json) plans each GPU job's FLOPs at measured_rate_percent of the
    rate its stage reached there; an unmeasured gpu_type keeps the datasheet share."""
    import json

    from circuitflow import measured

    config = cf_config.load(READY["gpt2-small"])
    path = REPO / "benchmarks" / "results" / "gpu_suite-nvidia-h200-cuda.json"
    suite = json.loads(path.read_text())
    rate = {(r["model"], r["stage"]): r["achieved_flops"] for r in suite["results"]
            if r["stage"] != "sae_train"}  # fmt: skip
    h200 = Cluster(gpu_type="H200", startup_minutes=0)
    for rule, stage in (("attribution", "attribution"), ("baseline", "forward")):
        behaviour = next(iter(config["behaviours"]))
        work = resources.job_work(config, rule, behaviour)
        want = sum(work.flops.values()) / (rate["gpt2-small", stage] * 0.5)
        want += work.disk_bytes / (h200.disk_mb_per_s * 1e6) + work.other_seconds
        got = resources.work_seconds(config, rule, h200, behaviour)
        assert got == pytest.approx(want, rel=1e-9), rule
        # The datasheet plan, for comparison: what an unmeasured GPU type gets.
        h100 = Cluster(gpu_type="H100", startup_minutes=0)
        assert resources.measured_rates(config, rule, h100) is None
    # A result file for another GPU, or a smoke run, is not read.
    (tmp_path / "gpu_suite-x-cuda.json").write_text(json.dumps({**suite, "mode": "small"}))
    assert measured.rule_rates("H200", "attribution", "gpt2-small", tmp_path) is None


def test_feature_browser_plans_each_dictionary_page_alone():
    """A dictionary's page of the feature browser (report_features_dictionary) plans its own
    features only, whatever the run's other dictionaries: at GPT-2 small's 12 SAEs of 24,576
    latents, 1.06 GiB of work a job where the single page of all 12 planned 6.1 GiB."""
    from circuitflow.description import describe
    from circuitflow.features import browser_plan as plan

    rule = "report_features_dictionary"
    cfg = cf_config.resolve(yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text()))
    dictionaries = describe(cfg).dictionaries
    assert len(dictionaries) == 12 and {d.width for d in dictionaries} == {24_576}
    one = plan.FIXED_BYTES + 24_576 * (plan.TEXT_BYTES_PER_FEATURE + plan.BUILD_BYTES_PER_FEATURE)
    for d in dictionaries:
        assert plan.job_bytes(cfg, rule, "cpu", f"{d.site}.{d.layer}") == one
    assert plan.job_bytes(cfg, rule, "cpu") == one  # the widest page: what the fit is checked on
    fewer = copy.deepcopy(cfg) | {"layers": cfg["layers"][:2]}
    assert plan.job_bytes(fewer, rule, "cpu", f"{dictionaries[0].site}.{dictionaries[0].layer}") \
        == one  # fmt: skip
    assert resources.mem_mb(cfg, rule, 1, "resid_post.3") == math.ceil(
        resources.job_peak_bytes(cfg, rule, "cpu", "resid_post.3") * resources.MEM_HEADROOM / 2**20
    )
    with pytest.raises(KeyError, match="no dictionary 'resid_post.99'"):
        plan.job_bytes(cfg, rule, "cpu", "resid_post.99")
