"""Published dictionaries as records, read without loading them: which dictionary fills each
site and layer (`sae.pretrained`'s templates filled in), what its config says (a local
directory's cfg.json; a SAELens release's cfg.json where the Hugging Face cache holds it) and
where a release lives on the hub.

A floor module: the run's description (circuitflow.description, each dictionary's real width),
the config checks and the stage (circuitflow.sae.pretrained, which checks and loads them) all
read dictionaries here. Nothing here imports torch or SAELens: it runs in the Snakemake process.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from circuitflow.errors import ConfigError, InputError
from circuitflow.nodes import hook_name

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
SAVE_HINT = "SAE.save_model or save_inference_model writes cfg.json and sae_weights.safetensors"


# --- which dictionary fills each site and layer ---------------------------------------------------
@dataclass(frozen=True)
class Dictionary:
    """The published dictionary that fills (site, layer): a release's SAE id, or a directory."""

    site: str
    layer: int
    release: str | None = None
    sae_id: str | None = None
    path: str | None = None

    @property
    def key(self) -> str:
        """The config key that named it."""
        return "sae.pretrained.path" if self.path is not None else "sae.pretrained.sae_id"

    @property
    def label(self) -> str:
        """How messages name it: the directory, or the release and its SAE id."""
        return self.path if self.path is not None else f"{self.release} {self.sae_id}"

    @property
    def hook(self) -> str:
        return hook_name(self.site, self.layer)

    def describe(self) -> dict[str, Any]:
        """Its source, for metrics.json and prefetch.json."""
        return {"release": self.release, "sae_id": self.sae_id, "path": self.path}


def expand(template: str, site: str, layer: int, key: str) -> str:
    try:
        return template.format(layer=layer, site=site)
    except (ValueError, KeyError, IndexError) as err:
        raise ConfigError(f"{key}: template {template!r} does not format ({err})") from None


def dictionary_for(p: Mapping[str, Any], site: str, layer: int) -> Dictionary:
    """The dictionary that fills (site, layer): the template of `p` (sae.pretrained) filled in."""
    if p.get("path") is not None:
        path = expand(p["path"], site, layer, "sae.pretrained.path")
        return Dictionary(site, int(layer), path=path)
    if not p.get("release") or not p.get("sae_id"):
        raise ConfigError("sae.pretrained: names neither path nor release and sae_id")
    sae_id = expand(p["sae_id"], site, layer, "sae.pretrained.sae_id")
    return Dictionary(site, int(layer), release=p["release"], sae_id=sae_id)


def dictionaries(config: Mapping[str, Any]) -> list[Dictionary]:
    """The dictionary of every configured site and layer."""
    p = config["sae"]["pretrained"]
    return [dictionary_for(p, s, int(n)) for s in config["sites"] for n in config["layers"]]


# --- a dictionary's config, read without loading it -----------------------------------------------
def cfg_view(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What the checks read from an SAE's config, in SAELens 6's format (metadata.hook_name) or
    an older one (top-level hook_name or hook_point), or from a loaded SAE's cfg.to_dict()."""
    meta = cfg.get("metadata") or {}

    def get(*names: str) -> Any:
        for name in names:
            for source in (meta, cfg):
                if source.get(name) is not None:
                    return source[name]
        return None

    norm = cfg.get("normalize_activations")
    if isinstance(norm, bool):  # SAELens < 6
        norm = "expected_average_only_in" if norm else "none"
    return {
        "d_in": cfg.get("d_in"),
        "d_sae": cfg.get("d_sae"),
        "k": cfg.get("k"),  # TopK and BatchTopK: latents active at a position
        "architecture": cfg.get("architecture"),
        "hook_name": get("hook_name", "hook_point"),
        "hook_head_index": get("hook_head_index", "hook_point_head_index"),
        "hook_name_out": get("hook_name_out"),
        "model_name": get("model_name"),
        "normalize_activations": norm or "none",
        "model_from_pretrained_kwargs": get("model_from_pretrained_kwargs") or {},
    }


def read_local(sae_dir: Path | str) -> dict[str, Any]:
    """The cfg_view of a local dictionary directory, after checking that it is in SAELens's
    format: cfg.json (a JSON object with d_in, d_sae and a hook) and sae_weights.safetensors
    with W_enc and W_dec. InputError naming the directory or file otherwise."""
    from circuitflow import inputs

    sae_dir = Path(sae_dir)
    if not sae_dir.exists():
        raise InputError(f"{sae_dir}: no such directory")
    if not sae_dir.is_dir():
        raise InputError(f"{sae_dir}: not a directory")
    missing = [name for name in (CFG_FILE, WEIGHTS_FILE) if not (sae_dir / name).is_file()]
    if missing:
        raise InputError(
            f"{sae_dir}: not a dictionary in SAELens's format (no {' or '.join(missing)}; "
            f"{SAVE_HINT})"
        )
    cfg = inputs.json_file(sae_dir / CFG_FILE, what="SAELens config")
    lacking = [k for k in ("d_in", "d_sae") if not isinstance(cfg.get(k), int)]
    if lacking:
        raise InputError(
            f"{sae_dir / CFG_FILE}: not a SAELens SAE config (no integer {', '.join(lacking)})"
        )
    view = cfg_view(cfg)
    if not view["hook_name"]:
        raise InputError(f"{sae_dir / CFG_FILE}: names no hook (metadata.hook_name)")
    names = inputs.safetensors_names(sae_dir / WEIGHTS_FILE)
    absent = {"W_enc", "W_dec"} - names
    if absent:
        raise InputError(
            f"{sae_dir / WEIGHTS_FILE}: no {', '.join(sorted(absent))} tensor, so not a SAELens "
            "SAE's weights"
        )
    return view


# --- SAELens's pretrained releases and the Hugging Face cache -------------------------------------
@functools.cache
def release_directory() -> dict[str, dict]:
    """SAELens's pretrained_saes.yaml (release -> repo_id, model, conversion_func, saes), read
    from the installed package without importing it (SAELens's import takes seconds; this runs
    when the config resolves)."""
    spec = importlib.util.find_spec("sae_lens")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("sae.pretrained.release: SAELens (sae-lens) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained_saes.yaml"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader) or {}  # noqa: S506 - a safe loader


@dataclass(frozen=True)
class Release:
    """Where a release's SAE id lives on the hub, as SAE.from_pretrained resolves it."""

    repo_id: str
    folder: str
    model: str | None  # the release's model in SAELens's directory
    conversion_func: str | None  # None: SAELens's own format (cfg.json, sae_weights.safetensors)
    published: dict[str, float]  # the directory's l0 and variance_explained for this id
    # The directory's config_overrides, which SAE.from_pretrained lays over the cfg.json (only
    # an older cfg.json carries model_from_pretrained_kwargs through to the loaded SAE).
    model_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def resolve_release(release: str, sae_id: str, layer_site: str = "") -> Release:
    """The hub repo and folder of `sae_id` in `release` (a SAELens release, or a Hugging Face
    repo id as SAE.from_pretrained also accepts); ConfigError naming the key otherwise."""
    directory = release_directory()
    entry = directory.get(release)
    if entry is None:
        if "/" in release:  # SAE.from_pretrained takes a repo id, the SAE id its folder
            return Release(release, sae_id, None, None, {})
        close = difflib.get_close_matches(release, directory, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"sae.pretrained.release: {release!r} is neither a SAELens pretrained release nor "
            f"a Hugging Face repo id (org/name){hint}"
        )
    saes = {str(s["id"]): s for s in entry.get("saes", [])}
    if sae_id not in saes:
        ids = list(saes)
        close = difflib.get_close_matches(sae_id, ids, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(
            f"sae.pretrained.sae_id: {sae_id!r}{layer_site} is not in release {release}; "
            f"{hint}its {len(ids)} ids look like {', '.join(ids[:3])}"
        )
    found = saes[sae_id]
    published = {k: float(found[k]) for k in ("l0", "variance_explained") if k in found}
    overrides = entry.get("config_overrides") or {}
    return Release(
        entry["repo_id"], str(found["path"]), entry.get("model"), entry.get("conversion_func"),
        published, dict(overrides.get("model_from_pretrained_kwargs") or {}),
    )  # fmt: skip


def hub_cache_dir(hf_cache: str | None) -> Path:
    """The hub cache the dictionaries are fetched into and read from: `model.hf_cache`/hub,
    else the environment's ($HF_HUB_CACHE, $HF_HOME/hub)."""
    if hf_cache:
        return Path(hf_cache).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_file(repo_id: str, filename: str, hf_cache: str | None) -> Path | None:
    """`filename` of `repo_id` (at its main revision) in the hub cache, or None: no network."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache_dir(hf_cache))
    return Path(found) if isinstance(found, str) else None


def cached_revision(repo_id: str, hf_cache: str | None) -> str | None:
    """The commit the cache's `main` of `repo_id` points at (what the job loaded), or None."""
    ref = hub_cache_dir(hf_cache) / f"models--{repo_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None


def release_view(rel: Release, hf_cache: str | None) -> dict[str, Any] | None:
    """The cfg_view of a release's SAE from its cfg.json in the cache, where the cache holds it
    and the release is in SAELens's own format (other formats are converted when loaded)."""
    if rel.conversion_func is not None:
        return None
    path = cached_file(rel.repo_id, f"{rel.folder}/{CFG_FILE}", hf_cache)
    if path is None:
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged cache entry: the job reads it and says so
    return cfg_view(cfg) if isinstance(cfg, dict) else None
