"""Plans that cannot fit are refused before any job (src/circuitflow/fit.py): the token set, a
job's host memory, the disk under outdir and a non-resumable job's walltime, each in one line
naming the config key that drives the plan and what the machine or profile offers."""

from __future__ import annotations

import copy

import pytest
import yaml
from helpers.dag import REPO, profile_cluster, run_snakemake

from circuitflow import config as cf_config
from circuitflow import fit, resources
from circuitflow.cluster import Cluster

GiB = 2**30
# A workstation: 23 GiB of memory, 77 GiB free under outdir, nothing there yet.
HERE = fit.Machine(memory=23 * GiB, free_disk=77 * GiB)
ISSUE = {"sae": {"source": "stream", "total_tokens": 900_000_000_000}}


def resolved(path: str, **changes) -> dict:
    """The config at `path` (from the repository) resolved, with `changes` ({"a.b": value})."""
    raw = yaml.safe_load((REPO / path).read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return cf_config.resolve(raw)


def profile(name: str, monkeypatch) -> Cluster:
    monkeypatch.setenv("CSD3_ACCOUNT", "PROJECT-SL2")
    monkeypatch.setenv("SLURM_PROJECT", "project")
    return profile_cluster(name)


def declared_jobs(config: dict) -> list[tuple[str, None]]:
    """Every row of the rule table with work, as if the workflow declared them all (more than
    any DAG runs: a real model's jobs never train it)."""
    real = config["model"]["name"] != "embedded"
    return [(rule, None) for rule, entry in resources.RULES.items()
            if entry.plan and not (real and rule == "train_model")]  # fmt: skip


# --- through Snakemake's CLI ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "offer"),
    [
        ((), r"this machine has \d[\d,.]* GiB of memory"),
        (
            ("--profile", "profiles/csd3"),
            r"a CPU node has 256 GiB \(the profile's cpu_node_mem_gib\)",
        ),
    ],
)
def test_the_issue_example_is_refused_by_the_dry_run_in_one_line(tmp_path, args, offer):
    """The issue's case: 900e9 streamed tokens on the embedded model passed validation and the
    dry run, and capture_tokens then died in numpy ("Unable to allocate 3.38 TiB for an array
    with shape (29032258129, 32)"). Now the dry run stops, naming the key and the memory."""
    import re

    done = run_snakemake(ISSUE, tmp_path, "-n", *args, check=False,
                         env={"CSD3_ACCOUNT": "PROJECT-SL2"})  # fmt: skip
    assert done.returncode != 0
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "config error:" in ln]
    assert len(lines) == 1, done.stdout + done.stderr
    expected = (
        "config error: sae.total_tokens: 900,000,000,000 tokens a layer need a 3.4 TiB token "
        f"set in capture_tokens; {offer}"
    )
    assert re.fullmatch(expected, lines[0]), lines[0]
    assert "capture_tokens" not in done.stdout.split("config error:")[0]  # no job planned
    assert not (tmp_path / "results").exists()


def test_a_run_above_the_free_disk_is_refused_when_it_starts(tmp_path):
    """Free disk is the moment's: the dry run warns in one line, the run stops before its first
    job with one line naming capture.n_tokens."""
    import shutil

    # Embedded model, 2 layers of resid_post: 2 x (64 fp16 + an int32 token) bytes a row,
    # and the token set's 2 x 4: 1.5 times the free disk.
    free = shutil.disk_usage(tmp_path).free
    n_tokens = int(1.5 * free / (2 * (64 * 2 + 4) + 8))
    if 20 * n_tokens > fit.memory_bytes():  # capture_tokens' plan must fit this machine
        pytest.skip("the disk is too large for this machine's memory to plan its fill")
    config = {"capture": {"n_tokens": n_tokens}}
    dry = run_snakemake(config, tmp_path, "-n", check=False)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    out = dry.stdout + dry.stderr
    warned = [ln for ln in out.splitlines() if "config warning: capture.n_tokens" in ln]
    assert len(warned) == 1 and warned[0].endswith(
        "free there; a run is refused until there is room"
    ), out
    # One cheap target (provenance's), so a broken check runs seconds of work, not the fill.
    target = tmp_path / "results" / "provenance" / "environment.json"
    done = run_snakemake(config, tmp_path, str(target), check=False)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    lines = [ln for ln in out.splitlines() if "config error:" in ln]
    assert len(lines) == 1 and lines[0].startswith(
        f"config error: capture.n_tokens: {n_tokens:,} plans "
    ), out
    assert "Finished job" not in out and not target.exists()


# --- each refusal ---------------------------------------------------------------------------------
def test_the_token_set_must_fit_the_memory_that_builds_it(monkeypatch):
    config = resolved("config/config.yaml", **{"sae.source": "stream",
                                                "sae.total_tokens": 900_000_000_000})  # fmt: skip
    # 29,032,258,129 contexts of 32 int32 tokens, numpy's 3.38 TiB.
    assert fit.token_set_bytes(config) == 4 * 29_032_258_129 * 32
    jobs = [("capture_tokens", None)]
    assert fit.problem(config, jobs, Cluster(), HERE) == (
        "sae.total_tokens: 900,000,000,000 tokens a layer need a 3.4 TiB token set in "
        "capture_tokens; this machine has 23 GiB of memory"
    )
    # Captured, not streamed: capture.n_tokens sets the token set.
    config = resolved("config/config.yaml", **{"capture.n_tokens": 20_000_000_000})
    assert fit.problem(config, jobs, Cluster(), HERE).startswith(
        "capture.n_tokens: 20,000,000,000 tokens a layer need a 77 GiB token set"
    )
    # A token set that fits is not refused (the default's: 1 MiB).
    assert fit.problem(resolved("config/config.yaml"), jobs, Cluster(), HERE) is None


def test_a_job_above_this_machines_memory_is_refused_naming_its_batch():
    config = resolved("config/config.yaml", device="cpu", **{"interventions.batch_size": 20_000})
    # On this machine the planned peak, without Slurm's headroom.
    need = fit.size(resources.job_peak_bytes(config, "interventions", "cpu"))
    assert need.endswith(" GiB") and float(need.split()[0]) > 23
    assert fit.problem(config, [("interventions", None)], Cluster(), HERE) == (
        f"interventions.batch_size: 20,000 plans {need} of host memory for interventions; "
        "this machine has 23 GiB of memory"
    )
    config = resolved("config/config.yaml", device="cpu", **{"attribution.batch_size": 200_000})
    problem = fit.problem(config, [("attribution", None)], Cluster(), HERE)
    assert problem.startswith("attribution.batch_size: 200,000 plans ")
    assert problem.endswith(" of host memory for attribution; this machine has 23 GiB of memory")
    # The same job on a machine that holds it passes.
    big = fit.Machine(memory=1 << 50, free_disk=77 * GiB)
    assert fit.problem(config, [("attribution", None)], Cluster(), big) is None


def test_a_job_above_a_node_of_the_profile_is_refused(monkeypatch):
    csd3 = profile("csd3", monkeypatch)
    assert (csd3.gpu_node_mem_gib, csd3.cpu_node_mem_gib, csd3.stated) == (1000, 256, True)
    # A GPU job's host memory: attribution keeps the validation prompts' gradients there.
    config = resolved(
        "config/gpt2-small.yaml",
        **{"attribution.validation_prompts": 30_000, "behaviours.ioi.n_prompts": 60_000},
    )
    asked = resources.mem_mb(config, "attribution") * resources.MB  # what sbatch asks for
    assert 1000 * GiB < asked < 2000 * GiB
    assert fit.problem(config, [("attribution", None)], csd3, HERE) == (
        f"attribution.validation_prompts: 30,000 plans {fit.size(asked)} of host memory for "
        "attribution; a node of partition ampere has 1,000 GiB (the profile's "
        "gpu_node_mem_gib)"
    )
    # A node of 2000 GiB holds it.
    bigger = Cluster(**{**csd3.__dict__, "gpu_node_mem_gib": 2000})
    assert fit.problem(config, [("attribution", None)], bigger, HERE) is None
    # This machine's memory does not matter on a Slurm profile.
    assert resources.mem_mb(config, "attribution") * resources.MB > HERE.memory


def test_the_disk_plan_must_fit_the_free_disk_under_outdir():
    # SAEs alone: one activation file a layer (the default's transcoders would add two).
    config = resolved("config/config.yaml", **{"capture.n_tokens": 400_000_000, "sae.kind": "sae"})
    assert fit.disk_problem(config, HERE) == (
        "capture.n_tokens: 400,000,000 plans 101 GiB under outdir results (activations "
        "101 GiB); 77 GiB free there"
    )
    # The small files' fixed 1 GiB allowance is not held against the disk: the embedded
    # default's 207 MiB of planned files (its SAEs' and transcoders' activations, 200 MiB) run
    # where 300 MiB are free, and not where 150 MiB are.
    small = fit.Machine(memory=23 * GiB, free_disk=300 * 2**20, used_disk=0)
    assert fit.disk_problem(resolved("config/config.yaml"), small) is None
    smaller = fit.Machine(memory=23 * GiB, free_disk=150 * 2**20, used_disk=0)
    assert fit.disk_problem(resolved("config/config.yaml"), smaller) is not None
    # Memory and walltime are another check's: they fit.
    assert fit.problem(config, declared_jobs(config), Cluster(), HERE) is None
    # A rerun writes only what is not there yet.
    rerun = fit.Machine(memory=23 * GiB, free_disk=77 * GiB, used_disk=90 * GiB)
    assert fit.disk_problem(config, rerun) is None
    assert fit.disk_problem(resolved("config/config.yaml"), HERE) is None


def test_the_disk_under_outdir_is_measured(tmp_path):
    (tmp_path / "results" / "a").mkdir(parents=True)
    (tmp_path / "results" / "a" / "x.bin").write_bytes(b"0" * 5000)
    here = fit.Machine.here(tmp_path / "results")
    assert here.used_disk == 5000
    assert 0 < here.free_disk and 0 < here.memory < 1 << 50
    # An outdir not made yet: its nearest parent's disk, nothing used.
    later = fit.Machine.here(tmp_path / "not" / "yet")
    assert later.used_disk == 0 and later.free_disk > 0
    assert fit.Machine.here().memory == here.memory


def test_a_job_that_cannot_resume_must_fit_max_runtime(monkeypatch):
    csd3 = profile("csd3", monkeypatch)
    config = resolved("config/gpt2-small.yaml", **{"behaviours.ioi.n_prompts": 200_000})
    jobs = [("interventions", None)]
    problem = fit.problem(config, jobs, csd3, HERE)
    assert problem.startswith("behaviours.ioi.n_prompts: 200,000 plans ")
    assert problem.endswith(
        " h for interventions, which cannot resume from a checkpoint; the profile's "
        "max_runtime is 36.0 h"
    )
    # The planned hours are attempt 1's work, not the walltime capped at max_runtime.
    hours = float(problem.split(" plans ")[1].split(" h ")[0].replace(",", ""))
    assert hours > 36 and resources.runtime(config, "interventions", 1, csd3) == 2160
    # No cap on a workstation; and a job that resumes from checkpoints is not refused.
    assert fit.problem(config, jobs, Cluster(), HERE) is None
    streamed = resolved("config/gpt2-small.yaml", **{"sae.total_tokens": 20_000_000_000})
    first = fit.first_minutes(streamed, "train_sae_stream", None, csd3)
    assert first > csd3.max_runtime
    roomy = fit.Machine(memory=23 * GiB, free_disk=1 << 50)
    assert fit.problem(streamed, [("train_sae_stream", None)], csd3, roomy) is None


@pytest.mark.parametrize(
    "path",
    [
        "config/config.yaml",
        "config/gpt2-small.yaml",
        "config/qwen2.5-0.5b.yaml",
        "config/gpt2-small-res-jb.yaml",
        ".test/config/tiny.yaml",
        ".test/config/small.yaml",
        ".test/config/transcoder.yaml",
    ],  # fmt: skip
)
@pytest.mark.parametrize("where", ["workstation", "csd3", "slurm-h100"])
def test_the_shipped_configs_fit(path, where, monkeypatch):
    """Every job of the shipped configs fits a 23 GiB workstation with 77 GiB free, and each
    example profile's nodes."""
    config = resolved(path)
    cluster = Cluster() if where == "workstation" else profile(where, monkeypatch)
    assert fit.problem(config, declared_jobs(config), cluster, HERE) is None


def test_a_profile_without_cluster_settings_is_this_machine():
    assert not Cluster.from_profile({}).stated
    assert not Cluster.from_profile({"mem_mb": 4000, "runtime": 60}).stated
    assert Cluster.from_profile({"cpu_node_mem_gib": 64}).cpu_node_mem_gib == 64


def test_the_driver_is_the_key_whose_halving_shrinks_the_plan_most():
    config = resolved("config/config.yaml", **{"sae.source": "stream"})
    bytes_ = fit.token_set_bytes
    assert fit.driver(config, bytes_) == "sae.total_tokens"
    assert fit.driver(resolved("config/config.yaml"), bytes_) == "capture.n_tokens"
    # Nothing the user sets shrinks it: the model.
    assert fit.driver(config, lambda c: 1.0) == fit.MODEL_KEY
    # The config is not changed by the search.
    before = copy.deepcopy(config)
    fit.driver(config, bytes_)
    assert config == before


def test_the_driver_looks_first_at_the_keys_the_user_set():
    """features: {k: 100000000}: halving features.k or sae.expansion_factor (the collectors'
    width) shrinks the features job alike; the user touched only k, so k is named."""
    config = resolved("config/config.yaml", **{"features.k": 100_000_000})
    problem = fit.problem(config, [("features", None)], Cluster(), HERE)
    assert problem.startswith("features.k: 100,000,000 plans "), problem
    # Untouched, the largest shrink wins as before.
    plain = resolved("config/config.yaml")
    assert fit.driver(plain, lambda c: resources.job_peak_bytes(c, "features", "cpu")) != (
        "features.k"
    )


def test_features_n_tokens_above_the_token_set_is_noted():
    notes: list[str] = []
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["features"] = {"n_tokens": 90_000_000_000}
    cf_config.resolve(raw, notes=notes)
    assert notes == [
        "config note: features.n_tokens: 90,000,000,000 is more than the token set's 262,167 "
        "tokens (capture.n_tokens); the features stage reads all 262,167"
    ]
