"""Planning imports no heavy library: every Snakemake invocation (a dry run, a run's main process,
each Slurm job, which re-parses the workflow) imports what workflow/rules/common.smk imports and
plans every job's memory and walltime. torch alone is about a second of CPU there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers.dag import REPO

from circuitflow import config as cf_config

HEAVY = ("torch", "pandas", "transformer_lens", "h5py")

# In a fresh interpreter: common.smk's imports, then every rule's memory, walltime, threads and
# retries for each config (its stream groups' and feature groups' jobs each), and the fit check.
PLAN = """
import json, sys
from circuitflow import cluster, config, dictionary_sources, fit, nodes, resources, sites
from circuitflow import stream_groups
from circuitflow.features import plan as features_plan
from circuitflow.report import gpu_hours

planned = {}
for name, (cfg, default_resources) in json.loads(sys.argv[1]).items():
    cl = cluster.Cluster.from_profile(default_resources)
    dictionary_sources.get(cfg)
    jobs = []
    for rule in resources.RULES:
        keys = [None]
        if rule == "train_sae_stream":
            streams = cfg["sae"]["source"] == "stream"
            keys = [g.key for g in stream_groups.stream_groups(cfg, cl)] if streams else []
        if rule == "features":
            keys = [g.key for g in features_plan.groups(cfg)]
        for key in keys:
            planned[f"{name} {rule} {key}"] = (
                resources.mem_mb(cfg, rule, 1, key), resources.runtime(cfg, rule, 1, cl, key),
                resources.threads(cfg, rule, cl), resources.retries(cfg, rule, cl, key),
            )
            jobs.append((rule, key))
    # Every rule of the table, used by the config or not: the check's answer is not the point.
    fit.problem(cfg, jobs, cl, fit.Machine(memory=2**40, free_disk=2**50))
    gpu_hours.suite_files(sys.argv[2])
heavy = [m for m in HEAVY if m in sys.modules]
print(json.dumps({"planned": planned, "heavy": heavy}))
"""


def test_planning_every_job_imports_no_heavy_library():
    """The default config and gpt2-small on the CSD3 profile (a Slurm cluster: no GPU probe),
    resolved here, planned in a fresh interpreter: it plans the same numbers as this process
    and imports neither torch, pandas, TransformerLens nor h5py."""
    from circuitflow import resources
    from circuitflow.cluster import Cluster

    csd3 = yaml.safe_load((REPO / "profiles" / "csd3" / "config.yaml").read_text())
    csd3 = {**csd3["default-resources"], "slurm_account": "x-CPU", "gpu_account": "x-GPU"}
    configs = {
        name: (cf_config.load(REPO / "config" / f"{name}.yaml"), default_resources)
        for name, default_resources in (("config", {}), ("gpt2-small", csd3))
    }
    suite = REPO / "benchmarks" / "results"
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PLAN}", json.dumps(configs), str(suite)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["heavy"] == []
    cfg, default_resources = configs["gpt2-small"]
    cl = Cluster.from_profile(default_resources)
    assert out["planned"]["gpt2-small attribution None"] == [
        resources.mem_mb(cfg, "attribution"), resources.runtime(cfg, "attribution", 1, cl),
        resources.threads(cfg, "attribution", cl), None,
    ]  # fmt: skip
    assert {key.split()[1] for key in out["planned"]} == set(resources.RULES)


@pytest.mark.parametrize("name", ["gemma-3-270m-transcoders", "qwen3-0.6b-transcoders"])
def test_a_release_not_yet_fetched_is_checked_without_saelens(name, tmp_path):
    """A config of releases SAELens converts (Gemma Scope 2's and Qwen3's transcoders),
    resolved before prefetch_saes has fetched anything: the checks read nothing, so SAELens
    and torch stay unimported (they cost a Snakemake process 15 CPU-s; Qwen3's releases name
    their model by a TransformerLens alias, read from its table alone), and the views wait
    for the prefetch."""
    code = (
        "import sys\n"
        "from circuitflow import config, published\n"
        f"cfg = config.load({str(REPO / 'config' / f'{name}.yaml')!r})\n"
        "views = [published.view_of(d) for d in published.dictionaries(cfg)]\n"
        "print(len(views), sum(v is None for v in views),"
        " [m for m in ('sae_lens', 'torch') if m in sys.modules])\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    n, unseen, heavy = done.stdout.split(maxsplit=2)
    assert int(n) > 0 and unseen == n and heavy.strip() == "[]", done.stdout
