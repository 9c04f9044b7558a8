# Helpers shared by the rules: the validated config, layer lists, behaviours and output paths.
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from circuitflow import cluster as cf_cluster
from circuitflow import config as cf_config
from circuitflow import dictionary_sources as cf_sources
from circuitflow import fit as cf_fit
from circuitflow import nodes as cf_nodes
from circuitflow import prefork as cf_prefork
from circuitflow import resources as cf_resources
from circuitflow import sites as cf_sites
from circuitflow.features import config as cf_features_config
from circuitflow.features import plan as cf_features_plan
from circuitflow.model import checkpoint as cf_checkpoint
from circuitflow.report import gpu_hours as cf_gpu_hours

try:
    # Schema validation (snakemake.utils.validate, defaults filled) runs first, then the checks
    # that need the model; a bad value stops here with one line naming the key. A relative
    # prompt file path resolves against the folder of the config file that set it (--config:
    # the working directory) and is stored absolute, so every job reads that same file.
    CONFIG_NOTES = []
    config.update(
        cf_config.resolve(
            config,
            base_dir=Path.cwd(),
            config_files=workflow.configfiles,
            overrides=workflow.config_settings.config,
            notes=CONFIG_NOTES,
        )
    )
except cf_config.ConfigError as err:
    raise WorkflowError(f"config error: {err}") from None

# What the config does only in part (token checks left to the jobs, per-prompt graphs not drawn
# or with MLPs left whole): one line each, once (jobs re-read this file: not there).
if workflow.is_main_process:
    for note in CONFIG_NOTES:
        logger.warning(note)


# Before the first job: jobs call the `python` on PATH (stage() below), which need not be the
# Python Snakemake runs in (.venv/bin/snakemake from cron, the environment not activated); one
# line naming it beats a ModuleNotFoundError from every job. Not in a dry run, --lint or
# --report (no job runs), nor with --sdm conda (the rules' conda environments bring their own).
onstart:
    from circuitflow.check_env import job_python_problem

    sdm = workflow.deployment_settings.deployment_method
    if workflow.is_main_process and (problem := job_python_problem(sdm)):
        raise WorkflowError(problem)
    # The run's files must fit the free disk under outdir now (a dry run only warns).
    if workflow.is_main_process and (problem := disk_problem()):
        raise WorkflowError(f"config error: {problem}")


OUT = config["outdir"]
SRC = Path(workflow.basedir) / "src"
SCRIPTS = Path(workflow.basedir) / "scripts"
# Sorted: the order a config lists behaviours in must not change a rule's params (a rerun).
BEHAVIOURS = sorted(config["behaviours"])
LAYERS = config["layers"]
SITES = config["sites"]
# Dictionaries: SAEs at SAE_SITES (attribution and interventions splice them) and, with
# sae.kind transcoder or both, a transcoder per layer saved at mlp_out (the per-prompt graphs').
TRANSCODERS = cf_sites.trains_transcoders(config)
SAE_SITES = cf_sites.sae_sites(config)
DICTIONARY_SITES = cf_sites.dictionary_sites(config)
# Where the dictionaries come from (sae.source; with sae.kind both the transcoders may come from
# sae.transcoders.source): each source's record (circuitflow.dictionary_sources) says which
# rules make its dictionaries and what they read: the capture stage's files (capture), the
# dictionary jobs' own forward passes over the token set (stream), or published ones
# (pretrained). The rule files ask the records, never a source's name; each source's rules see
# its part of the run (cf_sources.part: its sites, sae.kind and sae.source).
SOURCE = cf_sources.get(config)  # the SAEs' (and, unless set apart, the transcoders')
SOURCES = cf_sources.used(config)
PARTS = {source.rule: cf_sources.part(config, source) for source in SOURCES}
# The token set's size is the training source's, where a source trains on it (stream).
TOKEN_SOURCE = cf_sources.token_set_source(config)
READS_ACTIVATION_FILES = cf_sources.run_reads_activation_files(config)
# What capture writes: every dictionary's site whose source reads activation files, and for
# transcoders their input, mlp_in.
CAPTURE_SITES = cf_sites.capture_sites(cf_sources.capture_part(config))


wildcard_constraints:
    behaviour="|".join(BEHAVIOURS),
    layer=r"\d+",
    site="|".join(dict.fromkeys(CAPTURE_SITES + DICTIONARY_SITES)),


def config_json(*keys):
    """The named config sections as a shell-quoted JSON argument. Rules pass only what they use,
    so editing an unrelated key does not make Snakemake rerun them. A function of the job's
    wildcards: Snakemake fills a string param's braces as wildcards, and a value may hold some
    (the templates of sae.pretrained)."""
    return json_param(cf_config.section(config, *keys))


def json_param(cfg):
    """`cfg` as a shell-quoted JSON param: a function, so braces in values are not wildcards."""
    text = shlex.quote(json.dumps(cfg, sort_keys=True))
    return lambda wildcards: text


def tokens_config_json():
    """What capture_tokens reads: the seed, model and capture sections; where the dictionary
    source trains on the token set (sae.source stream) also its budget (sae.total_tokens
    training rows, sae.eval_contexts held out).
    """
    if not TOKEN_SOURCE.trains_on_token_set:
        return config_json("seed", "model", "capture")
    cfg = cf_config.section(config, "seed", "model", "capture")
    cfg["sae"] = {
        key: config["sae"][key] for key in ("total_tokens", "eval_contexts")
    } | {"source": TOKEN_SOURCE.name}
    return json_param(cfg)


def capture_config_json():
    """What capture reads: the seed, device, model, layers and capture sections, and the sites
    it writes (CAPTURE_SITES)."""
    cfg = cf_config.section(config, "seed", "device", "model", "layers", "capture")
    return json_param(cfg | {"sites": CAPTURE_SITES})


def stream_config_json(part):
    """What the stream jobs read: the seed, device, model and SAE config of their part of the
    run, and of the capture section how rows are cut, stored and batched (not
    capture.n_tokens)."""
    keys = ("exclude_bos", "dtype", "max_batch_size", "memory_fraction")
    cfg = cf_config.section(part, "seed", "device", "model", "sae")
    cfg["capture"] = {key: config["capture"][key] for key in keys}
    return json_param(cfg)


# A warm interpreter's socket (circuitflow.prefork: the test suite's runs), or None.
PREFORK = os.environ.get(cf_prefork.ENV)


def stage(name, online=False, light=False):
    """The command line that runs stage script `scripts/<name>.py`. src/ is prepended to
    PYTHONPATH (the caller's entries kept: a module loaded on CSD3 often sets it) so the rules
    also work in the conda environment of envs/; stage jobs never reach the Hugging Face hub
    (weights were pre-fetched by a localrule on a machine with internet). Torch gets exactly the
    job's threads: oversubscribed OpenMP threads spin and slow every job ~10x. With PREFORK set,
    a job that loads a model (not `light`) is forked from that warm interpreter, unless it goes
    online or sets HF_HOME (both read when the libraries are imported).
    """
    offline = "" if online else "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "
    # model.hf_cache must be HF_HOME before Python starts: huggingface_hub and transformers
    # read it once, on import, and TransformerLens imports them before any stage code runs.
    if config["model"]["hf_cache"]:
        home = Path(config["model"]["hf_cache"]).expanduser()
        offline = f"HF_HOME={shlex.quote(str(home))} {offline}"
    threads = "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
    # ${PYTHONPATH:+:...} is safe under `set -u`; the doubled braces survive Snakemake's format.
    path = f"PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}} "
    python = "python"
    if PREFORK and not (online or light or config["model"]["hf_cache"]):
        python = f"python -m circuitflow.prefork {shlex.quote(PREFORK)}"
    return f"{offline}{threads}{path}{python} {SCRIPTS / name}.py"


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


TOKEN_SET = [f"{OUT}/activations/tokens.npy", f"{OUT}/activations/tokens.json"]


def capture_outputs(sites=None):
    """The activation files capture writes (at `sites`: those of the given sites it writes)."""
    if not READS_ACTIVATION_FILES:
        return []
    return expand(
        f"{OUT}/activations/{{site}}/layer_{{layer}}.h5",
        site=[s for s in CAPTURE_SITES if sites is None or s in sites],
        layer=LAYERS,
    )


def dictionary_activations(wildcards):
    """The activation files a train_sae job reads: its site's, or for a transcoder the MLP's
    input and output at its layer."""
    transcoder = cf_sites.dictionary_kind(config, wildcards.site) == "transcoder"
    sites = ["mlp_in", "mlp_out"] if transcoder else [wildcards.site]
    return [f"{OUT}/activations/{site}/layer_{wildcards.layer}.h5" for site in sites]


def sae_job_config_json(wildcards):
    """What a train_sae job reads: the seed, device, model and SAE sections of its part of the
    run, sae.kind the kind of its own dictionary (with sae.kind both, an SAE or a transcoder by
    its site), so a job is the one a run of that kind alone would run."""
    part = PARTS["train_sae"]
    cfg = cf_config.section(part, "seed", "device", "model", "sae")
    cfg["sae"] = cfg["sae"] | {"kind": cf_sites.dictionary_kind(part, wildcards.site)}
    return json_param(cfg)(wildcards)


def sae_outputs():
    """Every dictionary: the SAEs and any transcoders."""
    return expand(
        f"{OUT}/saes/{{site}}/layer_{{layer}}", site=DICTIONARY_SITES, layer=LAYERS
    )


def spliced_sae_outputs():
    """The SAEs attribution and interventions splice (no transcoder)."""
    return expand(f"{OUT}/saes/{{site}}/layer_{{layer}}", site=SAE_SITES, layer=LAYERS)


def transcoder_outputs():
    """The transcoders (sae.kind transcoder or both), one per layer."""
    if not TRANSCODERS:
        return []
    return expand(f"{OUT}/saes/mlp_out/layer_{{layer}}", layer=LAYERS)


def features_outputs(sites=None):
    """Every dictionary's feature folder (features.smk; at `sites`: those sites' only)."""
    return [
        f"{OUT}/features/{site}/layer_{layer}"
        for site, layer in cf_features_plan.members(config)
        if sites is None or site in sites
    ]


def replacement_outputs():
    """Transcoders: the loss with every MLP replaced by its transcoder at once."""
    return [f"{OUT}/saes/replacement.json"] if TRANSCODERS else []


# ---- Job resources: the rule table in src/circuitflow/resources.py, the cluster from the profile
# A Slurm profile (profiles/csd3, profiles/local-slurm) states its cluster among its
# default-resources: accounts, GPU partition and GRES, walltime cap, CPUs per GPU, GPU type and
# the rates walltimes assume (circuitflow.cluster.Cluster; profiles/README.md lists them).
# Snakemake parses this file before it picks the executor, so that is how rules see the cluster.
try:
    CLUSTER = cf_cluster.Cluster.from_profile(
        workflow.resource_settings.default_resources
    )
except cf_config.ConfigError as err:
    raise WorkflowError(f"profile error: {err}") from None

# Without a valid account sbatch fails per job with an obscure message; say it once, up front
# (not inside Slurm jobs, which re-read this file).
if workflow.is_main_process and (problem := CLUSTER.account_problem()):
    raise WorkflowError(problem)


# Every (rule, job) job_resources plans: what check_fit() checks before any job.
PLANNED_JOBS = []


def job_resources(rule, job=None, memory_by=None):
    """resources: of `rule`: memory and walltime that grow with each retry, and on a Slurm
    profile the partition, GRES and account of a GPU job (CPU jobs take the profile's defaults).
    `job`: which of the rule's jobs, where one rule is defined per job (for train_sae_stream,
    its group's key); else the job's behaviour wildcard, where it has one. `memory_by`: the
    wildcard whose value the memory plan differs by (train_sae: site, an SAE or a transcoder),
    or several, joined with "." (report_features_dictionary: site and layer, its anchor).
    """
    PLANNED_JOBS.append((rule, job))
    res = {
        "mem_mb": lambda wc, attempt: cf_resources.mem_mb(
            config, rule, attempt, job or memory_key(wc, memory_by)
        ),
        "runtime": lambda wc, attempt: cf_resources.runtime(
            config, rule, attempt, CLUSTER, job or wc.get("behaviour")
        ),
        "gpus": cf_resources.gpus(config, rule),
    }
    if res["gpus"] and CLUSTER.gpu_partition:
        res["slurm_partition"] = CLUSTER.gpu_partition
        res["slurm_account"] = CLUSTER.gpu_job_account()
        if CLUSTER.gpu_gres:
            res["gres"] = f"{CLUSTER.gpu_gres}:{res['gpus']}"
        else:
            # A cluster without GPUs (the local test one): the in-job srun would ask for --gpus.
            res["gpus"] = 0
    return res


def memory_key(wildcards, memory_by):
    """The job's value of the wildcard(s) `memory_by` (job_resources), or None."""
    if not memory_by:
        return None
    names = [memory_by] if isinstance(memory_by, str) else memory_by
    return ".".join(str(wildcards.get(name)) for name in names)


def job_retries(rule, job=None):
    """retries: of a job that resumes from checkpoints on a cluster that caps walltime: as
    many as its attempts need to cover its planned work (circuitflow.resources.retries); None
    (the profile's) elsewhere, and inside a cluster job: a retry is a new submission with its
    own walltime, not a rerun in the allocation whose end sent SIGTERM."""
    if not workflow.is_main_process:
        return None
    return cf_resources.retries(config, rule, CLUSTER, job)


def check_fit():
    """Refuse a plan that cannot fit the profile's nodes or this machine (memory, walltime) in
    one line naming the config key (circuitflow.fit); warn of one that does not fit the free
    disk under outdir now (onstart refuses it). Called once all rules are declared."""
    if problem := cf_fit.problem(config, PLANNED_JOBS, CLUSTER, cf_fit.Machine.here()):
        raise WorkflowError(f"config error: {problem}")
    if problem := disk_problem():
        logger.warning(
            f"config warning: {problem}; a run is refused until there is room"
        )


def disk_problem():
    """Why the run's files cannot fit the free disk under outdir now, or None."""
    return cf_fit.disk_problem(config, cf_fit.Machine.here(OUT))


# Snakemake starts ready jobs of higher priority first. The default run's tail is attribution
# then interventions (75 s on 2 cores, the longest job after training); left at 0, the feature
# pages and prompt graphs ready beside attribution went first and interventions ran alone last.
CRITICAL_PATH = 10


def job_threads(rule):
    """threads: of `rule` (on Slurm, --cpus-per-task, or --cpus-per-gpu for GPU jobs)."""
    return cf_resources.threads(config, rule, CLUSTER)


ATTR = f"{OUT}/attribution"


def prompt_graph_outputs():
    """Transcoders: per-prompt replacement graphs (attribution.prompt_graphs > 0)."""
    if not TRANSCODERS or not config["attribution"]["prompt_graphs"]:
        return []
    return expand(
        f"{ATTR}/{{behaviour}}/{{name}}",
        behaviour=BEHAVIOURS,
        name=["prompt_graphs", "prompt_graphs.html"],
    )


def behaviour_prompt_graphs(wildcards):
    """The behaviour's per-prompt graphs where transcoders draw them (report_behaviour's page
    leads with them), else none."""
    return [
        p for p in prompt_graph_outputs() if Path(p).parent.name == wildcards.behaviour
    ][:1]


def attribution_outputs():
    """Attribution and interventions splice SAEs: a run of transcoders alone (sae.kind
    transcoder) trains, measures and reports its dictionaries, draws its per-prompt graphs and
    stops there; with sae.kind both, the per-prompt graphs come beside the attribution.
    """
    if not SAE_SITES:
        return prompt_graph_outputs()
    return prompt_graph_outputs() + expand(
        f"{ATTR}/{{behaviour}}/{{name}}",
        behaviour=BEHAVIOURS,
        name=["heads.parquet", "features.parquet", "graph.json"],
    )


def job_envmodules():
    """envmodules: of every rule: the profile's `envmodules` entry (CSD3: rhel8/default-amp),
    loaded in each job when the profile also sets `software-deployment-method: env-modules`.
    """
    modules = CLUSTER.envmodules
    return [modules] if modules else []


IV = f"{OUT}/interventions"


def interventions_outputs():
    """Per behaviour the summary (its main output) and the table across behaviours."""
    if not SAE_SITES:
        return []
    return expand(f"{IV}/{{behaviour}}/summary.json", behaviour=BEHAVIOURS) + [
        f"{IV}/heads_across_behaviours.parquet"
    ]


REPORT = f"{OUT}/report"
# The feature browser: its index (report_features), and beside it in features/ a page per
# dictionary (report_features_dictionary; circuitflow.nodes.dictionary_page), where the graph
# pages open their feature nodes' cards.
FEATURE_BROWSER = f"{REPORT}/{cf_nodes.BROWSER_INDEX}"


def feature_browser_outputs():
    """The feature browser's index, in a run with dictionaries to browse."""
    return [FEATURE_BROWSER] if features_outputs() else []


def feature_page_outputs():
    """Each dictionary's page of the feature browser."""
    return [
        f"{REPORT}/{cf_nodes.dictionary_page(site, layer)}"
        for site, layer in cf_features_plan.members(config)
    ]


def feature_browser_option(wildcards=None):
    """`--features-html` of a job whose page links its feature nodes to the browser (the
    index's path: the page links each feature's card relative to its folder), none in a run
    without the browser.
    """
    return " ".join(f"--features-html {p}" for p in feature_browser_outputs())


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
        + replacement_outputs()
        + features_outputs()
        + attribution_outputs()
        + interventions_outputs()
    )


def report_outputs():
    """The report's pages (job_costs runs after all of them) and the run's provenance."""
    return provenance_run_outputs() + [f"{REPORT}/job_costs.html"]
