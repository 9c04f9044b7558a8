# Helpers shared by the rules: the validated config, layer lists, behaviours and output paths.
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from circuitflow import config as cf_config
from circuitflow import resources as cf_resources
from circuitflow.report import gpu_hours as cf_gpu_hours

try:
    # Schema validation (snakemake.utils.validate, defaults filled) runs first, then the checks
    # that need the model; a bad value stops here with one line naming the key. A relative
    # prompt file path resolves against the folder of the config file that set it (--config:
    # the working directory) and is stored absolute, so every job reads that same file.
    config.update(
        cf_config.resolve(
            config,
            base_dir=Path.cwd(),
            config_files=workflow.configfiles,
            overrides=workflow.config_settings.config,
        )
    )
except cf_config.ConfigError as err:
    raise WorkflowError(f"config error: {err}") from None

OUT = config["outdir"]
SRC = Path(workflow.basedir) / "src"
SCRIPTS = Path(workflow.basedir) / "scripts"
# Sorted: the order a config lists behaviours in must not change a rule's params (a rerun).
BEHAVIOURS = sorted(config["behaviours"])
LAYERS = config["layers"]
SITES = config["sites"]


wildcard_constraints:
    behaviour="|".join(BEHAVIOURS),
    layer=r"\d+",
    site="|".join(SITES),


def config_json(*keys):
    """The named config sections as a shell-quoted JSON argument. Rules pass only what they use,
    so editing an unrelated key does not make Snakemake rerun them."""
    return shlex.quote(json.dumps(cf_config.section(config, *keys), sort_keys=True))


def stage(name, online=False):
    """The command line that runs stage script `scripts/<name>.py`. src/ is prepended to
    PYTHONPATH (the caller's entries kept: a module loaded on CSD3 often sets it) so the rules
    also work in the conda environment of envs/; stage jobs never reach the Hugging Face hub
    (weights were pre-fetched by a localrule on a machine with internet). Torch gets exactly the
    job's threads: oversubscribed OpenMP threads spin and slow every job ~10x.
    """
    offline = "" if online else "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "
    threads = "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
    # ${PYTHONPATH:+:...} is safe under `set -u`; the doubled braces survive Snakemake's format.
    path = f"PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}} "
    return f"{offline}{threads}{path}python {SCRIPTS / name}.py"


def prompt_file(wildcards):
    """A `file` behaviour's prompt file (an absolute path once validated): an edit reruns it."""
    path = config["behaviours"][wildcards.behaviour].get("path")
    return [path] if path else []


def baseline_outputs():
    return expand(f"{OUT}/baseline/{{behaviour}}.json", behaviour=BEHAVIOURS)


def provenance_outputs():
    return [
        f"{OUT}/provenance/environment.json",
        f"{OUT}/provenance/config.resolved.yaml",
    ]


def capture_outputs():
    return expand(
        f"{OUT}/activations/{{site}}/layer_{{layer}}.h5", site=SITES, layer=LAYERS
    )


def sae_outputs():
    return expand(f"{OUT}/saes/{{site}}/layer_{{layer}}", site=SITES, layer=LAYERS)


# ---- Job resources: estimates in src/circuitflow/resources.py, cluster facts from the profile --
# A Slurm profile (profiles/csd3, profiles/local-slurm) declares, among its default-resources,
# the accounts, the GPU partition, the GRES of a GPU job and the walltime cap. Snakemake parses
# this file before it picks the executor, so these entries are how rules see the cluster.
PROFILE_RESOURCES = {
    name: getattr(value, "raw", value)
    for name, value in (workflow.resource_settings.default_resources or {}).items()
}


def profile_setting(name, default=None):
    """A profile default-resource as a value: env vars expanded, quotes removed."""
    raw = PROFILE_RESOURCES.get(name)
    return default if raw is None else cf_resources.setting_value(raw)


# Without a valid account sbatch fails per job with an obscure message; say it once, up front
# (not inside Slurm jobs, which re-read this file).
if workflow.is_main_process:
    for key in ("slurm_account", "gpu_account"):
        problem = cf_resources.account_problem(key, profile_setting(key, "set"))
        if problem:
            raise WorkflowError(problem)


# The machine a job's walltime assumes (resources.Cluster): the profile's settings, else CSD3's.
CLUSTER = cf_resources.Cluster.from_settings(profile_setting)


def job_resources(rule):
    """resources: of `rule`: memory and walltime that grow with each retry, and on a Slurm
    profile the partition, GRES and account of a GPU job (CPU jobs take the profile's defaults).
    """
    res = {
        "mem_mb": lambda wc, attempt: cf_resources.mem_mb(config, rule, attempt),
        "runtime": lambda wc, attempt: cf_resources.runtime(
            config, rule, attempt, CLUSTER, wc.get("behaviour")
        ),
        "gpus": cf_resources.gpus(config, rule),
    }
    if res["gpus"] and profile_setting("gpu_partition"):
        res["slurm_partition"] = profile_setting("gpu_partition")
        res["slurm_account"] = profile_setting(
            "gpu_account", profile_setting("slurm_account")
        )
        if profile_setting("gpu_gres"):
            res["gres"] = f"{profile_setting('gpu_gres')}:{res['gpus']}"
        else:
            # A cluster without GPUs (the local test one): the in-job srun would ask for --gpus.
            res["gpus"] = 0
    return res


def job_threads(rule):
    """threads: of `rule` (on Slurm, --cpus-per-task, or --cpus-per-gpu for GPU jobs)."""
    return cf_resources.threads(config, rule)


ATTR = f"{OUT}/attribution"


def attribution_outputs():
    return expand(
        f"{ATTR}/{{behaviour}}/{{name}}",
        behaviour=BEHAVIOURS,
        name=["heads.parquet", "features.parquet", "graph.json"],
    )


def job_envmodules():
    """envmodules: of every rule: the profile's `envmodules` entry (CSD3: rhel8/default-amp),
    loaded in each job when the profile also sets `software-deployment-method: env-modules`.
    """
    modules = profile_setting("envmodules")
    return [modules] if modules else []


IV = f"{OUT}/interventions"


def interventions_outputs():
    """Per behaviour the summary (its main output) and the table across behaviours."""
    return expand(f"{IV}/{{behaviour}}/summary.json", behaviour=BEHAVIOURS) + [
        f"{IV}/heads_across_behaviours.parquet"
    ]


REPORT = f"{OUT}/report"


def provenance_run_outputs():
    """Provenance collected after the stages: input hashes, Slurm jobs, pip freeze, seeds."""
    return [
        f"{OUT}/provenance/{name}"
        for name in ("hashes.json", "slurm_jobs.json", "pip_freeze.txt", "run.json")
    ]


def stage_outputs():
    """The main outputs of every stage (what the after-the-run provenance hashes)."""
    return (
        baseline_outputs()
        + capture_outputs()
        + sae_outputs()
        + attribution_outputs()
        + interventions_outputs()
    )


def report_outputs():
    """The report's pages (job_costs runs after all of them) and the run's provenance."""
    return provenance_run_outputs() + [f"{REPORT}/job_costs.html"]
