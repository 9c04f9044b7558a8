"""The CSD3 Slurm profile: its dry-run sbatch lines, and the whole pipeline on a real local Slurm
cluster with accounting (tests/slurm/cluster.sh) through profiles/local-slurm, which is generated
from profiles/csd3 with only the `# local:` substitutions (account, GRES, log directory)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

if __name__ == "__main__":  # run as a script (to regenerate the profile): helpers are one up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.dag import REPO, SNAKEMAKE, load_test_config, profile_cluster, run_snakemake

from circuitflow import config as cf_config
from circuitflow import resources
from circuitflow.cluster import Cluster
from circuitflow.resources import GPU_RULES, PER_GROUP_RULES

pytestmark = pytest.mark.slow
TINY = load_test_config("tiny")

CSD3 = REPO / "profiles" / "csd3" / "config.yaml"
LOCAL = REPO / "profiles" / "local-slurm" / "config.yaml"
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
LOCAL_HEADER = (
    "# GENERATED from profiles/csd3/config.yaml by `python tests/workflow/test_slurm.py`"
    ":\n# the CSD3 profile with the `# local:` values for the local test cluster (tests/slurm),\n"
    "# which has the same partition names, no GPUs and the account circuitflow-test.\n"
)
MARKED = re.compile(r"^(\s*[\w-]+:\s*)(\S.*?)\s+# local: (.*)$")


def local_profile_text() -> str:
    """profiles/csd3 with each `# local:` value swapped in: nothing else may differ."""
    lines = []
    for line in CSD3.read_text().splitlines():
        m = MARKED.match(line)
        if m:
            value = m.group(3) if m.group(3) != "''" else "\"''\""
            if line.lstrip().startswith(("slurm_account", "gpu_account", "gpu_gres", "envmodules")):
                value = f'"{m.group(3)}"'
            line = f"{m.group(1)}{value}  # csd3: {m.group(2)}"
        lines.append(line)
    return LOCAL_HEADER + "\n".join(lines) + "\n"


def test_local_profile_is_csd3_with_documented_substitutions():
    assert LOCAL.read_text() == local_profile_text(), "run: python tests/workflow/test_slurm.py"
    csd3, local = yaml.safe_load(CSD3.read_text()), yaml.safe_load(LOCAL.read_text())
    differ = {k for k in csd3 if csd3[k] != local[k]}
    assert differ <= {"slurm-logdir", "default-resources"}
    res_differ = {
        k
        for k in csd3["default-resources"]
        if csd3["default-resources"][k] != local["default-resources"][k]
    }
    assert res_differ == {"slurm_account", "gpu_account", "gpu_gres", "envmodules"}
    # The settings the local test proves are the CSD3 ones.
    assert "slurm-array-jobs" not in local and local["slurm-status-command"] == "sacct"


# ------------------------------------------------------------------------ dry run, CSD3 --------
def _dry_run_jobs(
    tmp_path: Path, configfile: Path, env: dict, profile: str = "profiles/csd3"
) -> list[dict]:
    cmd = [*SNAKEMAKE, "--profile", profile, "--configfile", str(configfile), "-n", "-p"]
    cmd += ["--directory", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs, job, group = [], None, None
    for line in done.stdout.splitlines():
        if m := re.search(r"Group job (\w+) ", line):
            group = m.group(1)
        elif m := re.match(r"^(\s*)(local)?rule (\w+):", line):
            # Members of a group job are indented under its "Group job" line.
            group = group if m.group(1) else None
            job = {"rule": m.group(3), "local": bool(m.group(2)), "threads": 1, "wildcards": ""}
            jobs.append(job | {"group": group})
            job = jobs[-1]
        elif job and (m := re.match(r"^\s+(threads|resources|wildcards): (.*)$", line)):
            job[m.group(1)] = m.group(2)
        elif job and line.lstrip().startswith("Shell command: "):
            job["shell"] = line.lstrip().removeprefix("Shell command: ")
    for job in jobs:
        pairs = re.findall(r"(\w+)=([^,]*)(?:, |$)", job.get("resources", ""))
        job["resources"] = {k: int(v) if v.isdigit() else v for k, v in pairs}
        job["threads"] = int(job["threads"])
    return jobs


def sbatch_line(job: dict) -> str:
    """The sbatch call the plugin would make for a dry-run job, built by the plugin itself."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    res = job["resources"]

    class Resources(SimpleNamespace):
        def get(self, key, default=None):
            return getattr(self, key, default)

    fake = SimpleNamespace(resources=Resources(**res), threads=job["threads"], name=job["rule"])
    params = {
        "run_uuid": "RUN",
        "slurm_logfile": f"LOGDIR/rule_{job['rule']}/%j.log",
        "comment_str": f"rule_{job['rule']}",
        "account": f"-A {res['slurm_account']}",
        "partition": f"-p {res['slurm_partition']}",
        "workdir": "WORKDIR",
    }
    return get_submit_command(fake, params) + set_gres_string(fake)


def test_csd3_dry_run_follows_csd3_rules(tmp_path):
    """GPT-2 small, 12 layers: GPU jobs on ampere with --gres=gpu:1 and the -GPU account, CPU jobs
    on icelake with the -CPU account, <= 32 CPUs per GPU, walltime within 36 h, one train_sae job
    per layer (no arrays). The config's SAEs from the capture stage's files, as before it
    streamed (test_csd3_dry_run_of_the_streaming_config has the config as it is)."""
    cfg = yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text())
    cfg["sae"] |= {"source": "capture", "total_tokens": 20_000_000}
    cfg["outdir"] = str(tmp_path / "results")
    configfile = tmp_path / "gpt2.yaml"
    configfile.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "CSD3_ACCOUNT": "DUMMY-SL2"}
    jobs = _dry_run_jobs(tmp_path, configfile, env)
    # prefetch_model is a localrule (login node): the dry run lists it like the others.
    remote = [j for j in jobs if j["rule"] not in ("all", "prefetch_model")]
    saes = [j for j in remote if j["rule"] == "train_sae"]
    assert len(saes) == 12
    lines = {}
    for job in remote:
        line = sbatch_line(job)
        lines.setdefault(job["rule"], line)
        minutes = int(re.search(r" -t '?(\d+)", line).group(1))
        assert 0 < minutes <= 36 * 60, line
        if "--gres=gpu:1" in line:
            assert "-p ampere" in line and "-A DUMMY-SL2-GPU" in line, line
            cpus = int(re.search(r"--cpus-per-(?:gpu|task)=(\d+)", line).group(1))
            assert 1 <= cpus <= 32, line
        else:
            assert "-p icelake" in line and "-A DUMMY-SL2-CPU" in line, line
        assert "--signal=TERM@120" in line
    for rule in ("baseline", "capture", "train_sae"):
        assert "--gres=gpu:1" in lines[rule], lines[rule]
    for rule in ("prompts", "provenance", "capture_tokens"):
        assert "--gres" not in lines[rule], lines[rule]
    print("\n".join(f"{rule}: {line}" for rule, line in sorted(lines.items())))
    # Walltimes are the planner's for the profile's cluster: train_sae's first attempt from its
    # work (20M tokens of a 24,576-latent SAE), well under the 36 h cap.
    config = cf_config.load(configfile)
    settings = yaml.safe_load(CSD3.read_text())["default-resources"]
    cluster = Cluster.from_profile(settings)
    for job in saes:
        assert job["resources"]["runtime"] == resources.runtime(config, "train_sae", 1, cluster)
        assert job["resources"]["runtime"] <= 6 * 60
    # Short CPU jobs are grouped: one submission before the GPU stages, one for the report.
    groups = {j["rule"]: j["group"] for j in jobs}
    assert {groups[r] for r in ("prompts", "provenance", "capture_tokens")} == {"inputs"}
    assert {groups[r] for r in ("job_costs", "report_behaviour", "sae_summary")} == {"report"}
    assert {groups[r] for r in ("train_sae", "baseline", "attribution", "capture")} == {None}

    # Without the account, or with its -GPU suffix: one clear error before anything is submitted.
    cmd = [*SNAKEMAKE, "--profile", "profiles/csd3", "--configfile", str(configfile), "-n"]
    for account, message in (
        (None, "export CSD3_ACCOUNT"),
        ("DUMMY-SL2-GPU", "CSD3_ACCOUNT=DUMMY-SL2 "),
    ):
        env.pop("CSD3_ACCOUNT", None)
        env.update({"CSD3_ACCOUNT": account} if account else {})
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode != 0 and message in done.stdout + done.stderr, account


def test_csd3_dry_run_of_the_streaming_config(tmp_path):
    """config/gpt2-small.yaml as it is (sae.source: stream, 300M tokens a layer): no capture
    job; the memory plan fits the 12 layers' SAEs on one A100, so one GPU job trains them all
    from one forward pass and writes each to its saes/resid_post/layer_N/; its memory and
    walltime are its group's plan (resources.mem_mb, resources.runtime with its key), a first
    attempt of at most resumable_max_runtime that grows on each retry."""
    from circuitflow.sae import stream_plan

    cfg = yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text())
    cfg["outdir"] = str(tmp_path / "results")
    configfile = tmp_path / "gpt2.yaml"
    configfile.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "CSD3_ACCOUNT": "DUMMY-SL2"}
    jobs = _dry_run_jobs(tmp_path, configfile, env)
    rules = {j["rule"] for j in jobs}
    assert not rules & {"capture", "capture_shard", "train_sae"}, rules
    config, cluster, group, res = _one_gpu_job_for_12_layers(
        jobs, configfile, "train_sae_stream", "resid_post"
    )
    assert res["runtime"] == cluster.resumable_max_runtime  # 300M tokens: it resumes
    # A job of one layer counts less than a sixth of the work of the job of twelve.
    one = stream_plan.StreamGroup((("resid_post", 11),)).key
    assert resources.work_seconds(config, "train_sae_stream", cluster, one) < (
        resources.work_seconds(config, "train_sae_stream", cluster, group.key) / 6
    )


def _one_gpu_job_for_12_layers(jobs: list[dict], configfile: Path, rule: str, site: str):
    """The dry run's one `rule`_{group} job for `site` at layers 0-11 on CSD3 (streaming or
    published dictionaries): a GPU job on ampere with the GPU account, naming every member and
    its output, asking its group's planned walltime and memory (resources.runtime and mem_mb
    with the group's key). Returns the config, the cluster, the group and its resources."""
    from circuitflow import stream_groups

    grouped = [j for j in jobs if j["rule"].startswith(f"{rule}_")]
    assert [j["rule"] for j in grouped] == [f"{rule}_{site}_layer_0_to_11"]
    line = sbatch_line(grouped[0])
    assert "--gres=gpu:1" in line and "-p ampere" in line and "-A DUMMY-SL2-GPU" in line, line
    shell = grouped[0]["shell"]
    assert all(f"{site}:{n}" in shell for n in range(12)), shell
    assert all(f"saes/{site}/layer_{n}" in shell for n in range(12)), shell
    config = cf_config.load(configfile)
    cluster = profile_cluster("csd3")
    (group,) = stream_groups.stream_groups(config, cluster)
    res = grouped[0]["resources"]
    assert res["runtime"] == resources.runtime(config, rule, 1, cluster, group.key)
    assert res["mem_mb"] == resources.mem_mb(config, rule, 1, group.key)
    return config, cluster, group, res


def test_csd3_dry_run_of_the_published_dictionaries_config(tmp_path):
    """config/gpt2-small-res-jb.yaml as it is (sae.source: pretrained, 12 layers): the release
    fetched by the prefetch_saes localrule, then one GPU job evaluates the 12 published SAEs
    (grouped as streaming groups them, `layers_per_job: auto`), writing each to its
    saes/resid_pre/layer_N/, with its group's memory and walltime (resources.mem_mb,
    resources.runtime with its key): 12 queue waits become one. A number of layers a job
    splits them as it splits streamed ones."""

    cfg = yaml.safe_load((REPO / "config" / "gpt2-small-res-jb.yaml").read_text())
    cfg["outdir"] = str(tmp_path / "results")
    configfile = tmp_path / "gpt2-jb.yaml"
    configfile.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "CSD3_ACCOUNT": "DUMMY-SL2"}
    jobs = _dry_run_jobs(tmp_path, configfile, env)
    assert "prefetch_saes" in {j["rule"] for j in jobs}  # a localrule: the login node
    _, cluster, _, res = _one_gpu_job_for_12_layers(jobs, configfile, "pretrained_sae", "resid_pre")
    assert res["runtime"] <= cluster.startup_minutes + 5  # seconds of counted work each

    cfg["sae"]["stream"] = {"layers_per_job": 4}
    configfile.write_text(yaml.safe_dump(cfg))
    jobs = _dry_run_jobs(tmp_path, configfile, env)
    # The dry run lists independent jobs in no fixed order.
    assert sorted(j["rule"] for j in jobs if j["rule"].startswith("pretrained_sae")) == [
        f"pretrained_sae_resid_pre_layer_{n}_to_{n + 3}" for n in (0, 4, 8)
    ]


def test_another_cluster_is_one_profile_folder(tmp_path):
    """profiles/slurm-h100, an example of another Slurm cluster (H100s in partition gpu, one
    account from $SLURM_PROJECT, 16 CPUs per GPU): the same workflow, no code change, places
    its jobs there and plans walltimes and the report's GPU-hours at the H100's rates."""
    cfg = yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text())
    cfg["sae"] |= {"source": "capture", "total_tokens": 20_000_000}  # one job per layer
    cfg["outdir"] = str(tmp_path / "results")
    configfile = tmp_path / "gpt2.yaml"
    configfile.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "SLURM_PROJECT": "lab-gpu"}
    env.pop("CSD3_ACCOUNT", None)
    profile = "profiles/slurm-h100"
    jobs = _dry_run_jobs(tmp_path, configfile, env, profile)
    settings = yaml.safe_load((REPO / profile / "config.yaml").read_text())["default-resources"]
    cluster = Cluster.from_profile(settings)
    assert (cluster.gpu_type, cluster.cpus_per_gpu, cluster.max_runtime) == ("H100", 16, 2880)
    config = cf_config.load(configfile)
    remote = [j for j in jobs if j["rule"] not in ("all", "prefetch_model", "prefetch_corpus")]
    for job in remote:
        line = sbatch_line(job)
        assert "-A lab-gpu" in line, line
        # A rule defined per group (features_layers_0_to_11) has its table row's name.
        row = next((r for r in PER_GROUP_RULES if job["rule"].startswith(f"{r}_")), job["rule"])
        if row in GPU_RULES:
            assert "-p gpu" in line and "--gres=gpu:1" in line, line
        else:
            assert "-p cpu" in line and "--gres" not in line, line
    saes = [j for j in remote if j["rule"] == "train_sae"]
    h100 = resources.runtime(config, "train_sae", 1, cluster)
    assert {j["resources"]["runtime"] for j in saes} == {h100}
    assert h100 < resources.runtime(config, "train_sae", 1, Cluster())  # faster than an A100
    report = next(j for j in jobs if j["rule"] == "report_gpu_hours")
    assert "--gpu H100" in report["shell"], report["shell"]
    # Unset, the account is refused in one line with this profile's own hint.
    env.pop("SLURM_PROJECT")
    cmd = [*SNAKEMAKE, "--profile", profile, "--configfile", str(configfile), "-n"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 0 and "export SLURM_PROJECT" in done.stdout + done.stderr


# ------------------------------------------------------------------- the local Slurm cluster ---
def _cluster(*args: str, check: bool = False):
    return subprocess.run(
        ["bash", str(CLUSTER), *args], capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def slurm_env():
    """A running local cluster and the environment that reaches it; stopped (by PID) afterwards."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("local Slurm cluster needs root and Debian packages (apt-get)")
    started = _cluster("start")
    if started.returncode != 0:
        _cluster("stop")
        pytest.skip(f"cannot run a local Slurm cluster: {started.stderr.strip()}")
    env_lines = _cluster("env").stdout
    env = dict(re.findall(r"export (\w+)=(.*)", env_lines))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stopped = _cluster("stop")
        print(stopped.stdout, stopped.stderr)


def _sacct(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,Partition,Account"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line]
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def _submitted(log: str) -> dict[str, list[str]]:
    """rule/wildcards -> Slurm job ids, from the plugin's log lines."""
    jobs: dict[str, list[str]] = {}
    for jobid, path in re.findall(r"SLURM jobid (\d+) \(log: (\S+?)\)", log):
        # <slurm-logdir>/rule_<name>[/<wildcards>]/<jobid>.log, or group_<name>/... for a group
        start = max(path.rfind("/rule_"), path.rfind("/group_"))
        key = path[start + 1 :].rsplit("/", 1)[0]
        jobs.setdefault(key, []).append(jobid)
    return jobs


def _shorten_once_training(train_log: Path, shortened: list) -> None:
    """Once `train_log` shows training, shorten the running train_sae job's walltime by 2
    minutes (its --signal=TERM@120 is then due at Slurm's next check) and append its job id
    to `shortened`; returns when it has, or when the test appends "stop"."""
    while not shortened:
        if train_log.is_file() and "Training SAE" in train_log.read_text(errors="replace"):
            running = subprocess.run(
                ["squeue", "-h", "-t", "R", "-o", "%i %k"], capture_output=True, text=True
            ).stdout.split("\n")
            jobs = [line.split()[0] for line in running if " rule_train_sae" in line]
            if jobs:
                subprocess.run(["scontrol", "update", f"JobId={jobs[0]}", "TimeLimit-=2"],
                               check=True, capture_output=True)  # fmt: skip
                shortened.append(jobs[0])
                return
        time.sleep(1)


# The profile's first status check comes 20 s after a submission and each check that finds
# nothing finished waits 10 s longer (up to 3 minutes): right for hour-long CSD3 jobs, mostly
# idle waiting for these seconds-long ones. Only the polling differs from the profile.
FAST_POLL = ("--slurm-init-seconds-before-status-checks", "5")

SLURM_TINY = {
    **TINY,
    "capture": {"n_tokens": 8192},
    # Checkpoints only every 250k tokens (the default): the walltime run's resume must come
    # from the checkpoint written on SIGTERM.
    "sae": {"kind": "sae", "total_tokens": 60000, "batch_size": 512, "eval_contexts": 8},
    "interventions": {"n_seeds": 1, "n_random_circuits": 3},
}


@pytest.mark.slurm
@pytest.mark.slow
def test_pipeline_on_local_slurm_and_walltime_resume(slurm_env, tmp_path):
    """The DAG through SAE training and the baseline goes through sbatch (sacct: COMPLETED,
    right partition and account; GPU and CPU rules both), one job per SAE layer; then a
    train_sae job whose walltime runs out while it trains (shortened once it has started) is
    signalled by Slurm, checkpoints on SIGTERM, and its retry (a longer walltime) resumes and
    finishes. The later rules get their resources from the same helper (the
    CSD3 dry run checks every rule's). About 6 minutes on 2 cores."""
    workdir = tmp_path / "run"
    results = workdir / "results"
    targets = [results / "saes" / "resid_post" / f"layer_{n}" for n in (0, 1)]
    targets.append(results / "baseline" / "induction.json")
    t0 = time.monotonic()
    done = run_snakemake(SLURM_TINY, workdir, "--profile", "profiles/local-slurm", *FAST_POLL,
                         *map(str, targets))  # fmt: skip
    print(f"local Slurm pipeline: {time.monotonic() - t0:.0f} s")
    log = done.stdout + done.stderr
    for layer in (0, 1):
        sae = results / "saes" / "resid_post" / f"layer_{layer}"
        assert (sae / "cfg.json").is_file() and (sae / "sae_weights.safetensors").is_file()
    assert (results / "baseline" / "induction.json").is_file()
    jobs = _submitted(log)
    assert {"rule_train_sae/resid_post_0", "rule_train_sae/resid_post_1"} <= set(jobs), jobs
    assert "rule_train_model" in {k.split("/")[0] for k in jobs}
    # The prompts ran in the profile's group of short CPU jobs: one sbatch, not one per job.
    assert any(k.startswith("group_inputs") for k in jobs), jobs
    ids = [i for v in jobs.values() for i in v]
    states = _sacct(ids)
    assert all(states[i][0] == "COMPLETED" for i in ids), states
    for key, job_ids in jobs.items():
        gpu = key.split("/")[0].removeprefix("rule_") in GPU_RULES
        partition = "ampere" if gpu else "icelake"
        assert all(states[i][1] == partition for i in job_ids), (key, states)
        assert all(states[i][2] == "circuitflow-test" for i in job_ids)

    # Walltime: layer 1 again, with a 4-minute walltime (--signal=TERM@120 would signal it 2 to
    # 2.5 minutes in: Slurm checks limits every 30 s). Tokens/s vary tenfold with the load and
    # start-up under a loaded suite can take a minute, so instead of sizing the work to outlast a
    # fixed signal, the test shortens the running job's walltime by 2 minutes (scontrol, as an
    # operator would) once its log shows training: the signal then comes within ~30 s (about 20
    # s in practice). The work is 75 s of the first SAE's speed (which that short run overstates,
    # about 1.3x: about 100 s of training), so it is still training then, even at twice the
    # speed. train_sae checkpoints and exits 75; attempt 2 resumes.
    sae_dir = results / "saes" / "resid_post" / "layer_1"
    speed = json.loads((sae_dir / "metrics.json").read_text())["tokens_per_s"]
    tokens = max(100_000, int(speed * 75) // 512 * 512)
    shutil.rmtree(sae_dir)
    cfg = {**SLURM_TINY, "sae": {**SLURM_TINY["sae"], "total_tokens": tokens}}
    train_log = results / "logs" / "train_sae" / "resid_post_layer_1.log"
    train_log.unlink(missing_ok=True)
    shortened = []
    watcher = threading.Thread(target=_shorten_once_training, args=(train_log, shortened))
    watcher.start()
    t0 = time.monotonic()
    try:
        done = run_snakemake(
            cfg,
            workdir,
            "--profile",
            "profiles/local-slurm",
            *FAST_POLL,
            str(sae_dir),
            # Only the missing SAE: not whatever else a code edit since the first run touched.
            "--rerun-triggers",
            "mtime",
            "--set-resources",
            "train_sae:runtime=4 if attempt == 1 else 30",
        )
    finally:
        shortened.append("stop")
        watcher.join()
    print(f"walltime run: {time.monotonic() - t0:.0f} s")
    log = done.stdout + done.stderr
    ids = _submitted(log)["rule_train_sae/resid_post_1"]
    assert len(ids) == 2, log
    states = _sacct(ids)
    assert states[ids[0]][0] in ("FAILED", "TIMEOUT"), states
    assert states[ids[1]][0] == "COMPLETED", states
    assert shortened[0] == ids[0], (shortened, ids)
    metrics = json.loads((sae_dir / "metrics.json").read_text())
    assert metrics["resumed"] is True, metrics
    assert "resumed from" in train_log.read_text()


if __name__ == "__main__":
    LOCAL.parent.mkdir(parents=True, exist_ok=True)
    LOCAL.write_text(local_profile_text())
    print(f"wrote {LOCAL}", file=sys.stderr)
