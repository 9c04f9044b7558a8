# Helpers shared by the rules: the validated config, layer lists, behaviours and output paths.
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from circuitflow import config as cf_config

try:
    # Schema validation (snakemake.utils.validate, defaults filled) runs first, then the checks
    # that need the model; a bad value stops here with one line naming the key.
    config.update(cf_config.resolve(config, base_dir=Path.cwd()))
except cf_config.ConfigError as err:
    raise WorkflowError(f"config error: {err}") from None

OUT = config["outdir"]
SRC = Path(workflow.basedir) / "src"
SCRIPTS = Path(workflow.basedir) / "scripts"
BEHAVIOURS = list(config["behaviours"])
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
    """The command line that runs stage script `scripts/<name>.py`. src/ goes on PYTHONPATH so
    the rules also work in the conda environment of envs/; stage jobs never reach the Hugging
    Face hub (weights were pre-fetched by a localrule on a machine with internet)."""
    offline = "" if online else "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "
    return f"{offline}PYTHONPATH={SRC} python {SCRIPTS / name}.py"


def baseline_outputs():
    return expand(f"{OUT}/baseline/{{behaviour}}.json", behaviour=BEHAVIOURS)


def provenance_outputs():
    return [
        f"{OUT}/provenance/environment.json",
        f"{OUT}/provenance/config.resolved.yaml",
    ]


def model_mem_mb(wildcards, attempt):
    """Host memory for jobs that hold the model; more on each retry (attempt counts from 1)."""
    base = 2000 if cf_config.is_embedded(config) else 16000
    return base * attempt
