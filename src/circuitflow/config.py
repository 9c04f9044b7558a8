"""Load, validate and resolve the pipeline configuration.

The JSON schema (workflow/schemas/config.schema.yaml, read through `circuitflow.schema`) checks
types, unknown keys and fills defaults through `snakemake.utils.validate`; the checks here need
more than a schema can say (layers against the model's depth, behaviour sources against the model
kind, files that exist, values that cannot work together). A stage's own checks live in its
config module (`sae/config.py`, `capture/config.py`): this module sits on the floor above the
stages and calls them, and no stage imports it (the sites a run's dictionaries sit at are
`circuitflow.sites`). Every failure is one line that names the key and, where there is a list,
the allowed values. A stage turns the sections it reads into their dataclasses with `typed`
(from `circuitflow.schema`, re-exported here).
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from circuitflow import dictionary_sources
from circuitflow.errors import ConfigError
from circuitflow.model import checkpoint
from circuitflow.model.architectures import (
    auto_active_heads,
    hf_field,
    model_cfg,
    read_hf_config,
)
from circuitflow.nodes import SITES
from circuitflow.schema import (
    LAYER_FORMS,
    SCHEMA_PATH,
    load_schema,
    problem,
    schema_defaults,
    typed,
)
from circuitflow.sites import trains_transcoders

EMBEDDED = "embedded"
__all__ = [
    "ConfigError",
    "load",
    "load_schema",
    "resolve",
    "schema_defaults",
    "section",
    "typed",
    "validate_schema",
]


def validate_schema(config: dict, schema_path: Path = SCHEMA_PATH) -> dict:
    """Validate against the schema with Snakemake's validator, filling defaults in place."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    try:
        validate(config, str(schema_path), set_default=True)
    except WorkflowError:
        # Snakemake's message repeats the whole schema; find the error that matters and say it once.
        raise ConfigError(problem(config, "", schema_path)) from None
    return config


def parse_layers(spec: Any, n_layers: int, key: str = "layers") -> list[int]:
    """`all`, an int, a list, or an inclusive range string "a-b" -> sorted layer indices."""
    if spec == "all":
        return list(range(n_layers))
    if isinstance(spec, bool):
        raise ConfigError(f"{key}: {spec!r} is not a layer specification")
    if isinstance(spec, int):
        layers = [spec]
    elif isinstance(spec, list):
        layers = list(spec)
    elif isinstance(spec, str) and (m := re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", spec)):
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise ConfigError(f"{key}: range {spec!r} is empty (start after end)")
        layers = list(range(lo, hi + 1))
    elif isinstance(spec, str) and spec.strip().isdigit():
        layers = [int(spec)]
    else:
        raise ConfigError(f"{key}: {spec!r} {LAYER_FORMS}")
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise ConfigError(
            f"{key}: layer {bad[0]} is outside the model; allowed layers: 0-{n_layers - 1}"
        )
    if len(set(layers)) != len(layers):
        raise ConfigError(f"{key}: {spec!r} lists a layer twice")
    return sorted(layers)


def is_embedded(config: dict) -> bool:
    return config["model"]["name"] == EMBEDDED


def model_n_layers(config: dict) -> int:
    """Depth of the configured model, read without loading weights."""
    model = config["model"]
    if is_embedded(config):
        return config["embedded"]["architecture"]["n_layers"]
    if model["n_layers"]:
        return model["n_layers"]
    path = Path(model["name"])
    if checkpoint.is_checkpoint(path):
        return model_cfg(config).n_layers
    if path.exists():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ConfigError(checkpoint.neither_kind(path))
        try:
            n_layers = hf_field(read_hf_config(path), "n_layers")
        except (OSError, ValueError) as err:
            raise ConfigError(f"model.name: {cfg_file} is not readable JSON ({err})") from None
        if n_layers is None:
            raise ConfigError(f"model.name: {cfg_file} does not say how many layers the model has")
        return n_layers
    from circuitflow.model.load import official_model_name, remote_n_layers

    name = official_model_name(model["name"])  # raises ConfigError for unknown names
    n_layers = remote_n_layers(name)
    if n_layers is None:
        raise ConfigError(
            f"model.n_layers: cannot read the layer count of {name!r} offline; "
            "run `snakemake prefetch_model --configfile <your config>` on a machine with "
            "internet or set model.n_layers"
        )
    return n_layers


def _sets(data: Any, keys: tuple[str, ...]) -> bool:
    """`data` (a config as a file or --config gives it) holds a value at `keys`."""
    for key in keys:
        if not isinstance(data, Mapping) or key not in data:
            return False
        data = data[key]
    return data is not None


def _read_all(config_files: Sequence[Path | str]) -> list[Any]:
    """Each config file as parsed (None for one that cannot be read: it set nothing)."""
    out = []
    for file in config_files:
        try:
            out.append(yaml.safe_load(Path(file).read_text()))
        except (OSError, yaml.YAMLError):
            out.append(None)
    return out


def path_origin(
    keys: tuple[str, ...],
    base_dir: Path,
    config_files: Sequence[Path | str] = (),
    overrides: Mapping | None = None,
) -> tuple[Path, str]:
    """The folder a relative path at config key `keys` resolves against, and those words for
    an error: the folder of the last config file that sets the key (later files override earlier
    ones, as Snakemake merges them); `base_dir` (the working directory) when the value comes
    from a --config override on the command line or from no file."""
    if _sets(overrides, keys):
        return base_dir, f"the working directory {base_dir} (the value is from --config)"
    for file in reversed([Path(f).absolute() for f in config_files]):
        try:
            data = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError):
            continue  # Snakemake read it already; a file it could not read set nothing
        if _sets(data, keys):
            return file.parent, f"the folder of config file {file}"
    return base_dir, f"the working directory {base_dir}"


def offline_tokenizer(config: dict):
    """The configured model's tokenizer when it can be had here without the network: the
    embedded model's word-level tokenizer (built from `embedded.language`, as the model stage
    builds it), a local model directory's, or a hub model's already in the Hugging Face cache.
    None otherwise: the prompts job then checks the answers' tokens."""
    if is_embedded(config):
        from circuitflow.model.language import LanguageConfig, SyntheticLanguage

        lang = typed(
            LanguageConfig, config["embedded"]["language"], "embedded.language", seed=config["seed"]
        )
        return SyntheticLanguage(lang).tokenizer
    from transformers import AutoTokenizer

    model = config["model"]
    if checkpoint.is_checkpoint(model["name"]):
        return checkpoint.load_tokenizer(model["name"])
    if Path(model["name"]).exists():
        names, options = [model["name"]], {}
    else:
        # The hub name as written, then TransformerLens's official name for an alias such as
        # gpt2-small, only where TransformerLens is imported already (model_n_layers did):
        # importing it takes seconds, and the ready configs set model.n_layers to avoid that.
        names = [model["name"]]
        if "transformer_lens" in sys.modules:
            from circuitflow.model.load import official_model_name

            names.append(official_model_name(model["name"]))
        cache = model["hf_cache"]  # prefetch sets HF_HOME to it: its hub/ is the cache
        options = {"local_files_only": True}
        options["cache_dir"] = Path(cache).expanduser() / "hub" if cache else None
    for name in dict.fromkeys(names):
        try:
            return AutoTokenizer.from_pretrained(name, **options)
        except Exception:  # noqa: BLE001, S112 - not here offline, or unreadable: the job checks
            continue
    return None


def check_behaviours(
    config: dict,
    base_dir: Path,
    config_files: Sequence[Path | str] = (),
    overrides: Mapping | None = None,
    notes: list[str] | None = None,
) -> None:
    """Behaviour sources against the model kind, and each `source: file` behaviour's file read
    as the prompts stage reads it: its `path` made absolute in `config` (a relative one against
    `path_origin`), then its columns, empty cells and row count and, where the model's tokenizer
    is at hand offline (`offline_tokenizer`), the prompts built from it (single-token answers
    and distractors, corrupted twins). Every error names the key and the file as resolved.
    Where there is no tokenizer, `notes` gets one line saying the prompts jobs check the
    tokens instead."""
    from circuitflow.prompts import (
        PROMPT_FILE_SUFFIXES,
        SOURCES,
        Encoder,
        allowed_sources,
        behaviour_rng,
        file_prompts,
        read_prompt_file,
    )

    embedded = is_embedded(config)
    allowed = allowed_sources(embedded)
    kind = "the embedded model" if embedded else "a real model"
    encoders: list = []  # the model's Encoder, or None where offline there is none: built once
    deferred = []  # the keys whose tokens the prompts job checks
    for name, spec in config["behaviours"].items():
        key = f"behaviours.{name}"
        source = spec["source"]
        if source not in allowed:
            raise ConfigError(
                f"{key}.source: {source!r} does not work with {kind}; allowed values: "
                + ", ".join(allowed)
            )
        if not SOURCES[source].needs_path:
            if "path" in spec:
                raise ConfigError(f"{key}.path: only used with source 'file', not {source!r}")
            continue
        if "path" not in spec:
            raise ConfigError(f"{key}.path: required when source is 'file'")
        path, where = Path(spec["path"]).expanduser(), ""
        if not path.is_absolute():
            folder, how = path_origin(
                ("behaviours", name, "path"), base_dir, config_files, overrides
            )
            path = (folder / path).absolute()
            where = f" ({spec['path']!r} resolved against {how})"
        if not path.is_file():
            raise ConfigError(f"{key}.path: file {path} does not exist{where}")
        if path.suffix.lower() not in PROMPT_FILE_SUFFIXES:
            raise ConfigError(f"{key}.path: {path} must be .csv or .jsonl")
        spec["path"] = str(path)  # jobs run elsewhere, on this resolved config
        n, n_key = spec["n_prompts"], f"{key}.n_prompts"
        try:
            if not encoders:
                tokenizer = offline_tokenizer(config)
                encoders.append(Encoder(tokenizer) if tokenizer is not None else None)
            if encoders[0] is None:
                read_prompt_file(path, n, n_key=n_key)
                deferred.append(f"{key}.path")
            else:  # the prompts job's own work (its rng too), output discarded: milliseconds
                rng = behaviour_rng(config["seed"], name)
                file_prompts(path, encoders[0], rng, n, n_key=n_key)
        except ConfigError as err:
            raise ConfigError(f"{key}.path: {err}") from None
    if deferred and notes is not None:
        notes.append(
            f"config note: {', '.join(deferred)}: answer and distractor tokens not checked now "
            f"(no tokenizer of {config['model']['name']} offline here); each prompts job checks "
            "them and stops on a bad row (to check them now, run `snakemake prefetch_model "
            "--configfile <your config>` first)"
        )


def check_embedded(config: dict) -> None:
    arch = config["embedded"]["architecture"]
    if arch["active_heads"] == "auto":
        arch["active_heads"] = auto_active_heads(arch["n_layers"], arch["n_heads"])
    if arch["d_model"] != arch["n_heads"] * arch["d_head"]:
        raise ConfigError(
            "embedded.architecture.d_head: n_heads * d_head must equal d_model "
            f"({arch['n_heads']} * {arch['d_head']} != {arch['d_model']})"
        )
    active = arch["active_heads"]
    if active is not None and (
        len(active) != arch["n_layers"] or any(not 1 <= a <= arch["n_heads"] for a in active)
    ):
        raise ConfigError(
            f"embedded.architecture.active_heads: {active} must list one count per layer "
            f"({arch['n_layers']}), each between 1 and n_heads ({arch['n_heads']})"
        )
    lang = config["embedded"]["language"]
    if lang["n_attributes"] > lang["n_subjects"]:
        raise ConfigError(
            "embedded.language.n_attributes: must not exceed n_subjects "
            f"({lang['n_attributes']} > {lang['n_subjects']})"
        )


def model_dims(config: dict) -> dict[str, int]:
    """d_model and n_ctx of the configured model where they can be read without loading weights
    or reaching the network (the embedded architecture, a local directory's config.json); empty
    for a hub model."""
    if is_embedded(config):
        arch = config["embedded"]["architecture"]
        return {"d_model": arch["d_model"], "n_ctx": arch["n_ctx"]}
    if checkpoint.is_checkpoint(config["model"]["name"]):
        shape = model_cfg(config)
        return {"d_model": shape.d_model, "n_ctx": shape.n_ctx}
    path = Path(config["model"]["name"])
    if not (path / "config.json").is_file():
        return {}
    hf = read_hf_config(path)
    dims = {name: hf_field(hf, name) for name in ("d_model", "n_ctx")}
    return {name: value for name, value in dims.items() if value is not None}


def layer_ranges(layers: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] as "0-2, 5, 7-8"."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def prompt_graph_notes(config: dict, n_layers: int, user_set: bool) -> list[str]:
    """What the per-prompt graphs of a resolved config leave out, one line each: with no
    transcoder to draw them on, none is drawn (said only where the user set
    attribution.prompt_graphs: its default is on); with transcoders at some layers only, the
    other layers' MLPs are whole error nodes in every graph."""
    n_graphs = config["attribution"]["prompt_graphs"]
    if not n_graphs:
        return []
    if not trains_transcoders(config):
        if not user_set:
            return []
        source = dictionary_sources.get(config)
        fix = (
            "set sae.kind both (SAEs and transcoders) or transcoder"
            if "transcoder" in source.kinds
            else f"sae.source {source.name} loads SAEs only: train transcoders in a run of "
            f"sae.source {' or '.join(dictionary_sources.making('both'))} with sae.kind both"
        )
        return [
            f"config note: attribution.prompt_graphs: {n_graphs} draws no per-prompt graph: "
            f"the graphs are drawn on transcoders and sae.kind is sae; {fix}"
        ]
    missing = sorted(set(range(n_layers)) - set(config["layers"]))
    if not missing:
        return []
    return [
        f"config warning: layers: transcoders at layers {layer_ranges(config['layers'])} of "
        f"{n_layers} only; the per-prompt graphs (attribution.prompt_graphs) hold the MLPs of "
        f"layers {layer_ranges(missing)} as whole error nodes, which caps their replacement "
        "score: set layers: all to replace every MLP"
    ]


# Sites an attention-only model lacks: it has no MLP, and no residual stream between the two.
MLP_SITES = ("resid_mid", "mlp_in", "mlp_out")


def check_model_sites(config: dict) -> None:
    """Sites and dictionaries the model has: none of MLP_SITES nor transcoders in an
    attention-only model; no resid_mid where attention and MLP read the same residual
    (parallel_attn_mlp); no mlp_in apart from resid_mid in a model without normalisation, where
    the MLP reads the residual stream as it is (nodes.hook_name)."""
    if is_embedded(config):
        return
    shape, name, sites = model_cfg(config), config["model"]["name"], config["sites"]
    if getattr(shape, "attn_only", False):
        if trains_transcoders(config):
            raise ConfigError(
                f"sae.kind: {config['sae']['kind']}: a transcoder stands in for an MLP, and "
                f"{name} is attention-only (attn_only: true); use sae.kind sae"
            )
        if lacking := [s for s in sites if s in MLP_SITES]:
            allowed = ", ".join(s for s in SITES if s not in MLP_SITES)
            raise ConfigError(
                f"sites: {lacking[0]}: {name} is attention-only (attn_only: true), with no "
                f"MLP; allowed values: {allowed}"
            )
    if getattr(shape, "parallel_attn_mlp", False) and "resid_mid" in sites:
        raise ConfigError(
            f"sites: resid_mid: {name} runs attention and MLP side by side "
            "(parallel_attn_mlp: true), with no residual stream between them"
        )
    if shape.normalization_type is None and "mlp_in" in sites:
        raise ConfigError(
            f"sites: mlp_in: {name} has no normalisation (normalization_type: null), so its "
            "MLP reads resid_mid as it is: use resid_mid"
        )


def check_cross_fields(config: dict, notes: list[str] | None = None) -> None:
    """Values that are each valid alone but cannot work together, refused before any job runs
    (each would otherwise fail inside a job, minutes or hours in): the sites the model has,
    then each stage's own checks, in its config module (`sae.config.check`,
    `capture.config.check`, `features.config.check`); `notes` gets a line for what a stage will
    do instead of what a value asks."""
    from circuitflow.capture import config as capture_config
    from circuitflow.capture.plan import context_length, token_set_contexts
    from circuitflow.features import config as features_config
    from circuitflow.model import architectures
    from circuitflow.sae import config as sae_config

    check_model_sites(config)
    dims = model_dims(config)
    sae_config.check(config, dims)
    capture_config.check(config, dims)
    cfg = architectures.model_cfg(config)
    counted = context_length(config, cfg) - int(bool(config["capture"]["exclude_bos"]))
    features_config.check(config, token_set_contexts(config) * counted,
                          notes if notes is not None else [])  # fmt: skip


def resolve(
    config: dict,
    base_dir: Path | str = ".",
    schema_path: Path = SCHEMA_PATH,
    *,
    config_files: Sequence[Path | str] = (),
    overrides: Mapping | None = None,
    notes: list[str] | None = None,
) -> dict:
    """Validate `config` and return it with defaults filled, `layers` as a list of ints and
    each prompt file's `path` absolute. `config_files` (in the order they were merged) and
    `overrides` (the command line's --config) say where each value came from: a relative path
    resolves against the folder of the config file that set it, else against `base_dir` (the
    working directory). `notes`, where given, gets a line for each thing the config does only
    in part (checks left to a job, per-prompt graphs not drawn or partly replaced): the
    Snakefile prints them once."""
    raw, config = config, copy.deepcopy(config)
    validate_schema(config, schema_path)
    if is_embedded(config):
        check_embedded(config)
    if checkpoint.is_checkpoint(config["model"]["name"]):
        try:
            checkpoint.check(config["model"]["name"])
        except ConfigError as err:
            raise ConfigError(f"model.name: {err}") from None
    from circuitflow.model import same_as

    _, same_as_notes = same_as.check(config)
    if notes is not None:
        notes.extend(same_as_notes)
    from circuitflow.sae.config import resolve_kind

    config["sae"]["kind"] = resolve_kind(config, is_embedded(config))
    n_layers = model_n_layers(config)
    config["layers"] = parse_layers(config["layers"], n_layers)
    check_behaviours(config, Path(base_dir).absolute(), config_files, overrides, notes)
    check_cross_fields(config, notes)
    if notes is not None:
        # Who set prompt_graphs: the config files and --config, or a config given as it is.
        given = [raw] if not config_files else [overrides, *_read_all(config_files)]
        user_set = any(_sets(data, ("attribution", "prompt_graphs")) for data in given)
        notes.extend(prompt_graph_notes(config, n_layers, user_set))
    from circuitflow.capture import config as capture_config
    from circuitflow.sae import config as sae_config

    def origin(section: str) -> Path:  # the folder a relative <section>.path resolves against
        key = (*section.split("."), "path")
        return path_origin(key, Path(base_dir).absolute(), config_files, overrides)[0]

    # Published dictionaries: the templates, and each dictionary readable without its weights.
    sae_config.check_pretrained(config, model_dims(config).get("d_model"), origin)
    capture_config.check_corpus(config, is_embedded(config))
    return config


def load(source: str | Path, base_dir: Path | str = ".") -> dict:
    """Config for a stage script: a JSON string is the resolved section a rule passes; a path is a
    user's YAML/JSON config file, validated and resolved here (relative prompt file paths
    against the file's folder)."""
    text = str(source)
    if text.lstrip().startswith("{"):
        return json.loads(text)
    path = Path(text)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return resolve(yaml.safe_load(path.read_text()) or {}, base_dir, config_files=[path])


def section(config: dict, *keys: str, same_as: bool = False) -> dict:
    """The named top-level keys only: rules pass just what they use, so an unrelated edit does
    not make Snakemake rerun them. `model.same_as` only where `same_as` asks for it and it is
    set: it changes nothing the other rules compute (the published dictionaries' rules and the
    provenance read it), and a run computed before the key existed keeps its params (readers
    use .get)."""
    out = {key: config[key] for key in keys}
    model = out.get("model")
    if model is not None and "same_as" in model and not (same_as and model["same_as"]):
        out["model"] = {k: v for k, v in model.items() if k != "same_as"}
    return out
