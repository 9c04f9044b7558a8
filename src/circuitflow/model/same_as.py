"""`model.same_as`: the user's word that a local model directory is a named model (a snapshot of
Qwen/Qwen3-0.6B on a cluster's shared disk), so that dictionaries published for that model fit
the run (sae.pretrained's model check, RunModel.matches).

The word is checked, offline, against what can be known of the named model without a download:
its Hugging Face config.json where the hub cache holds it (`model.hf_cache`, else the
environment's), else the shapes circuitflow keeps of the models its ready configs name
(model.architectures) and, for the architecture, TransformerLens's registry of the models it
supports (a data file in its package, read without importing it). The fields compared are
CHECKED: the architecture (Hugging Face's `architectures[0]`), d_model, the layers and the
vocabulary. A field neither side states is left unchecked and said so in a config note; a named
model of which nothing is known offline is refused, as is a directory that differs in any field
that is known. `check` runs when the config resolves; its record goes to the provenance
(environment.json's `model_same_as`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from circuitflow.errors import ConfigError
from circuitflow.model import checkpoint
from circuitflow.model.architectures import (
    FIELDS,
    KNOWN_SHAPES,
    architecture_key,
    hf_field,
    read_hf_config,
)

KEY = "model.same_as"
# The fields compared, and how messages name them.
CHECKED = {"architecture": "architecture", "d_model": "d_model", "n_layers": "layers",
           "d_vocab": "vocabulary"}  # fmt: skip
TL_REGISTRY = ("tools", "model_registry", "data", "supported_models.json")


def directory_fields(path: Path) -> tuple[dict[str, Any], str]:
    """The CHECKED fields of a local model directory (None where it does not state one), and
    the file they were read from: a Hugging Face directory's config.json, or a TransformerLens
    checkpoint's tl_config.json (its `original_architecture`, where it kept one)."""
    if checkpoint.is_checkpoint(path):
        shape = checkpoint.shape(path)
        arch = checkpoint.read_fields(path).get("original_architecture")
        fields = {"architecture": arch, "d_model": shape.d_model, "n_layers": shape.n_layers,
                  "d_vocab": shape.d_vocab}  # fmt: skip
        return fields, str(path / checkpoint.CONFIG)
    return hf_fields(read_hf_config(path)), str(path / "config.json")


def hf_fields(hf: dict) -> dict[str, Any]:
    """The CHECKED fields of a Hugging Face config dict."""
    archs = hf.get("architectures") or [None]
    return {"architecture": archs[0]} | {f: hf_field(hf, f) for f in ("d_model", "n_layers",
                                                                       "d_vocab")}  # fmt: skip


@functools.cache
def tl_registry() -> dict[str, str]:
    """TransformerLens's registry of the models it supports: hub id -> architecture ({} where
    the installed TransformerLens ships none)."""
    spec = importlib.util.find_spec("transformer_lens")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*TL_REGISTRY)
    try:
        models = json.loads(path.read_text()).get("models", [])
        return {m["model_id"]: m["architecture_id"] for m in models if m.get("architecture_id")}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def cached_config(name: str, hf_cache: str | None) -> Path | None:
    """The named model's config.json in the hub cache, or None (no network)."""
    if "/" not in name:
        return None
    from circuitflow.published import cached_file

    try:
        return cached_file(name, "config.json", hf_cache)
    except Exception:  # noqa: BLE001 - not a repo id huggingface_hub accepts
        return None


def reference(name: str, hf_cache: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """What can be known offline of model `name`: each CHECKED field it states, and where each
    came from, in words."""
    found = cached_config(name, hf_cache)
    if found is not None:
        try:
            fields = hf_fields(json.loads(found.read_text()))
        except (OSError, ValueError, AttributeError):
            fields = {}
        known = {f: v for f, v in fields.items() if v is not None}
        return known, dict.fromkeys(known, f"its config.json in the Hugging Face cache ({found})")
    known, where = {}, {}
    key = architecture_key(name)
    table = FIELDS.get(key) if key else KNOWN_SHAPES.get(name.lower())
    if table:
        for field in ("d_model", "n_layers", "d_vocab"):
            known[field], where[field] = table[field], "circuitflow's table of model shapes"
        if table.get("original_architecture"):
            known["architecture"] = table["original_architecture"]
            where["architecture"] = "circuitflow's table of model shapes"
    if "architecture" not in known and (arch := tl_registry().get(name)):
        known["architecture"], where["architecture"] = arch, "TransformerLens's model registry"
    return known, where


def check(config: dict) -> tuple[dict[str, Any] | None, list[str]]:
    """`model.same_as` checked against the directory `model.name`: its record (None when the key
    is not set) and config notes (the fields that could not be checked offline). ConfigError in
    one line naming the key: set for a model that is not a local directory, naming a model of
    which nothing is known offline, or a directory that differs from it."""
    model = config["model"]
    name = model.get("same_as")
    if name is None:
        return None, []
    path = Path(str(model["name"])).expanduser()
    if model["name"] == "embedded" or not path.is_dir():
        raise ConfigError(
            f"{KEY}: {name}: only for a local model directory (model.name), and "
            f"{model['name']!r} is not one: a model named by its hub name is that model"
        )
    mine, file = directory_fields(path)
    theirs, where = reference(str(name), model.get("hf_cache"))
    if not theirs:
        raise ConfigError(
            f"{KEY}: {name}: nothing is known of that model offline to check {path} against "
            "(not in the Hugging Face cache, model.hf_cache, nor a model circuitflow or "
            "TransformerLens knows): fetch its config.json into the cache "
            f"(huggingface-cli download {name} config.json)"
        )
    checked, unchecked = {}, []
    for field, words in CHECKED.items():
        if field not in theirs or mine.get(field) is None:
            unchecked.append(words)
            continue
        if mine[field] != theirs[field]:
            raise ConfigError(
                f"{KEY}: {name}: {path} is not that model: its {words} is {mine[field]!r} "
                f"({file}), {name}'s {theirs[field]!r} ({where[field]})"
            )
        checked[field] = mine[field]
    record = {"model": str(path), "same_as": name, "checked": checked,
              "sources": {f: where[f] for f in checked}, "unchecked": unchecked}  # fmt: skip
    notes = []
    if unchecked:
        notes.append(
            f"config note: {KEY}: {name}: {path} checked on its "
            f"{_listed([CHECKED[f] for f in checked])}; its {_listed(unchecked)} could not be "
            "known offline, so not checked"
        )
    return record, notes


def _listed(words: list[str]) -> str:
    return " and ".join(filter(None, (", ".join(words[:-1]), words[-1])))
