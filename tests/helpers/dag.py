"""Running the real workflow through Snakemake's CLI, on the configs under .test/config/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TEST_CONFIGS = REPO / ".test" / "config"


def load_test_config(name: str) -> dict:
    """.test/config/<name>.yaml without its `outdir` (tests write to their own directories)."""
    config = yaml.safe_load((TEST_CONFIGS / f"{name}.yaml").read_text())
    config.pop("outdir", None)
    return config


# Niceness of the whole-DAG runs a test starts, added to its worker's (conftest's UNIT_NICE, all
# but the default run's): below the shared runs', which the most tests wait for, so on 2 cores
# the default run (the suite's longest chain) is not slowed by the rest.
NICE = 5


_PREFORK: dict[str, subprocess.Popen | str] = {}


def prefork_socket(listening: bool = False) -> str:
    """This test process's warm interpreter (circuitflow.prefork), started on first use with the
    whole-DAG runs' niceness; stopped when the process exits. `listening`: return once it
    listens (a client that finds no server runs its job fresh instead)."""
    from circuitflow import prefork

    if not _PREFORK:
        import atexit
        import tempfile

        path = str(Path(tempfile.mkdtemp(prefix="cf-prefork-")) / "socket")
        server = prefork.start(path, preexec_fn=lambda: os.nice(NICE))
        # Waited for, so the jobs' CPU time counts in this process's children (a suite's total).
        atexit.register(lambda: (server.terminate(), server.wait()))
        _PREFORK.update(server=server, path=path)
    if listening:
        prefork.wait_listening(_PREFORK["server"], str(_PREFORK["path"]))
    return str(_PREFORK["path"])


def prefork_cpu_seconds() -> float:
    """CPU seconds of this process's warm interpreter and of the jobs it forked that ended
    (it reaps them as they end), read from /proc while it runs: 0 before it starts."""
    if not _PREFORK:
        return 0.0
    try:
        stat = Path(f"/proc/{_PREFORK['server'].pid}/stat").read_text()
    except FileNotFoundError:
        return 0.0
    utime, stime, cutime, cstime = map(int, stat.rsplit(")", 1)[1].split()[11:15])
    return (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


def run_snakemake(
    config: dict,
    workdir: Path,
    *args: str,
    check: bool = True,
    env=None,
    nice: int = NICE,
    prefork: bool = False,
):
    """Run the real workflow (Snakemake's CLI) with `config` written to a file in `workdir`;
    outputs go to `workdir/results` unless `config` names an outdir. `nice`: added to the
    process's niceness (its jobs inherit it). `prefork`: jobs that load a model are forked from
    this process's warm interpreter (prefork_socket), each saving ~8 CPU-s of imports; their
    benchmarks then measure the client, so not for runs whose max_rss or cpu_time a test reads.
    CIRCUITFLOW_TEST_PREFORK=0 turns it off (to compare, or to rule it out)."""
    if prefork and os.environ.get("CIRCUITFLOW_TEST_PREFORK") != "0":
        env = {**(env or {}), "CIRCUITFLOW_PREFORK": prefork_socket()}
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"outdir": str(workdir / "results"), **config}
    cfg_file = workdir / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [
        *SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(REPO),
        "--configfile",
        str(cfg_file),
        "--cores",
        "2",
        # The suite's runs share the repository's .snakemake/, and a run that ends removes the
        # whole locks/ folder (Snakemake's _delete_locks) under a run about to write its lock
        # file: FileNotFoundError .snakemake/locks/0.input.lock. Each run has its own outdir.
        "--nolock",
        *args,
    ]
    # Rules call `python`: make it this interpreter, as an activated environment would.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1", **(env or {})}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=1800,
                          preexec_fn=(lambda: os.nice(nice)) if nice else None)  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"snakemake failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


# What train_model reads (its params: rule train_model in workflow/rules/model.smk), and what it
# leaves beside the model: a run whose config agrees on these keys would train the same model.
MODEL_KEYS = ("seed", "device", "embedded")
MODEL_FILES = ("model", "benchmarks/train_model.tsv", "logs/train_model.log")


def place_model(trained: Path, config: dict, results: Path) -> None:
    """Copy a finished run's model (MODEL_FILES, times kept) from results directory `trained`
    into `results`, for a run of `config`: Snakemake then skips train_model, which would write
    the same files (each tiny-config DAG test trained the same model, ~7 s of CPU apiece)."""
    source = yaml.safe_load((trained.parent / "config.yaml").read_text())
    assert all(config.get(k) == source.get(k) for k in MODEL_KEYS), "another model: train it"
    for name in MODEL_FILES:
        src, dest = trained / name, results / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest)
        else:
            shutil.copy2(src, dest)


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def profile_cluster(name: str):
    """The circuitflow.cluster.Cluster that profiles/<name> states, read as common.smk reads
    it (its default-resources)."""
    from circuitflow.cluster import Cluster

    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    return Cluster.from_profile(profile["default-resources"])
