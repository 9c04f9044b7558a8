"""scripts/check_env.py: passes on this CPU machine; fails with a clear list when a requirement
is missing (a GPU the config asks for, bf16 on a GPU without it, a package, disk)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.dag import REPO

from circuitflow import check_env


def _script(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_env.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_passes_on_cpu(tmp_path):
    out = tmp_path / "check.json"
    done = _script("--device", "cpu", "--outdir", str(tmp_path), "--min-free-gb", "0.1",
                   "--json", str(out))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all requirements met" in done.stdout
    names = {c["name"] for c in json.loads(out.read_text())["checks"]}
    assert {"python", "package torch", "cuda available", "bf16 on GPU", "tiny forward pass",
            "tiny SAE step"} <= names  # fmt: skip


def test_cuda_without_gpu_fails_clearly(tmp_path):
    out = tmp_path / "check.json"
    done = _script("--device", "cuda", "--outdir", str(tmp_path), "--min-free-gb", "0.1",
                   "--json", str(out))  # fmt: skip
    checks = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    if checks["cuda available"]["value"]:
        assert done.returncode == 0, done.stdout  # a GPU machine: device: cuda works here
        return
    assert done.returncode == 1
    assert "requirement(s) not met" in done.stdout
    assert "config device: device: cuda but torch sees no GPU" in done.stdout


def test_bf16_on_old_gpu_is_caught():
    facts = {"cuda_available": True, "bf16": False,
             "gpus": [{"name": "Tesla V100", "memory_gib": 32.0, "capability": "7.0"}]}  # fmt: skip
    device, checks = check_env.resolve_device({"device": "auto", "model": {"dtype": "bfloat16"}},
                                              facts)  # fmt: skip
    assert device == "cuda"
    bad = check_env.failures(checks)
    assert [c["name"] for c in bad] == ["config dtype"]
    assert "Tesla V100 does not support bf16" in bad[0]["detail"]


def test_missing_package_and_disk_are_listed(monkeypatch, tmp_path):
    monkeypatch.setattr(check_env, "REQUIRED_PACKAGES", ("torch", "no-such-package-xyz"))
    checks = check_env.check_packages() + [check_env.check_disk(tmp_path / "new", 1e9)]
    text = check_env.format_checks(checks)
    assert "package no-such-package-xyz: missing" in text
    assert "free disk under" in text and "2 requirement(s) not met" in text


def test_disk_check_counts_what_the_configured_run_writes(monkeypatch, tmp_path):
    """A Qwen2.5-0.5B run writes about 180 GB of activations (4M rows x 24 layers x 896 x 2
    bytes): 75 GiB free is refused, naming what the run writes; the default run fits."""
    import collections

    import yaml
    from helpers.dag import REPO as REPO_ROOT

    from circuitflow import config as cf_config
    from circuitflow import resources

    qwen = cf_config.load(REPO_ROOT / "config" / "qwen2.5-0.5b.yaml")
    streamed = resources.disk_plan(qwen)  # the ready config streams: no activation files
    assert streamed["activations"] < 2**32  # the token set: 300M int32 tokens and a copy
    qwen["sae"]["source"] = "capture"  # the same run from the capture stage's files
    plan = resources.disk_plan(qwen)
    assert plan["activations"] >= 4_194_304 * 24 * 896 * 2
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(check_env.shutil, "disk_usage", lambda p: usage(0, 0, 75 * 2**30))
    check = check_env.check_disk(tmp_path, 5.0, plan)
    total = sum(plan.values()) / 2**30
    assert not check["ok"] and f"the configured run writes {total:,.1f} GiB" in check["detail"]
    assert "activations 168.4" in check["detail"], check  # GiB, by part
    embedded = cf_config.resolve(yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text()))
    assert check_env.check_disk(tmp_path, 5.0, resources.disk_plan(embedded))["ok"]


# ---------------------------------------------- the start-up check of the jobs' `python` ------
def _python_without(tmp_path, *present: str):
    """A `python` on its own PATH directory that finds only `present` of the job modules (stand-in
    packages): the venv's interpreter without its site-packages, as a python outside it is."""
    fake = tmp_path / "site"
    for name in present:
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return bin_dir, python


def test_job_python_without_the_stack_is_one_line_naming_it(tmp_path):
    bin_dir, python = _python_without(tmp_path, "torch")
    problem = check_env.job_python_problem(path=str(bin_dir))
    assert problem is not None and "\n" not in problem
    assert f"jobs run {python} (the `python` on PATH)" in problem
    assert "cannot import transformer_lens, sae_lens, h5py:" in problem  # torch is there
    assert "activate the environment (`. " in problem and "or use `--sdm conda`" in problem


def test_job_python_with_the_stack_or_under_conda_passes(tmp_path):
    import os

    from snakemake_interface_executor_plugins.settings import DeploymentMethod

    assert check_env.job_python_problem(path=os.path.dirname(sys.executable)) is None
    bin_dir, _ = _python_without(tmp_path)
    conda = {DeploymentMethod.CONDA, DeploymentMethod.ENV_MODULES}  # as workflow holds them
    assert check_env.job_python_problem(conda, path=str(bin_dir)) is None
    modules = {DeploymentMethod.ENV_MODULES}  # CSD3's profile: jobs still call PATH's python
    assert "cannot import torch" in check_env.job_python_problem(modules, str(bin_dir))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no `python` on PATH" in check_env.job_python_problem(path=str(empty))


def test_snakemake_stops_before_the_first_job_when_python_lacks_the_stack(tmp_path):
    """`.venv/bin/snakemake` run without the environment active (PATH's python has no torch):
    one line naming that python, and no job starts."""
    import os

    from helpers.dag import load_test_config, run_snakemake

    bin_dir, python = _python_without(tmp_path / "py")
    target = tmp_path / "results" / "provenance" / "environment.json"
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    done = run_snakemake(load_test_config("tiny"), tmp_path, str(target), check=False,
                         env={"PATH": path})  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    lines = [ln for ln in out.splitlines() if f"jobs run {python}" in ln]
    assert len(lines) == 1 and "cannot import torch, transformer_lens, sae_lens, h5py" in lines[0]
    assert not (tmp_path / "results" / "logs").exists(), out  # no job ran
