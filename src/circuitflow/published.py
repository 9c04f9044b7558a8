"""Published dictionaries as records, read without loading them: which dictionary fills each
site and layer (`sae.pretrained`'s templates filled in, or for the transcoders of sae.kind both
`sae.transcoders`'), what its config says (a local directory's cfg.json; a SAELens release's
cfg.json where the Hugging Face cache holds it; a release SAELens converts, or a local copy of
one, read by that conversion's own config function) and where a release lives on the hub.

A floor module: the run's description (circuitflow.description, each dictionary's real width),
the config checks and the stage (circuitflow.sae.pretrained, which checks and loads them) all
read dictionaries here. Nothing here imports torch or SAELens at module level: it runs in the
Snakemake process; a converted release's config is read through SAELens's conversion, whose
import (seconds) only a config of such dictionaries pays.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from circuitflow import dictionary_sources
from circuitflow.errors import ConfigError, InputError
from circuitflow.nodes import hook_name
from circuitflow.sites import dictionary_sites

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
SAVE_HINT = "SAE.save_model or save_inference_model writes cfg.json and sae_weights.safetensors"


# --- which dictionary fills each site and layer ---------------------------------------------------
SAELENS_FORMAT = "saelens"  # sae.pretrained.format: a directory as SAE.save_model writes it


@dataclass(frozen=True)
class Dictionary:
    """The published dictionary that fills (site, layer): a release's SAE id, or a directory
    (`format` saelens), or a file or folder `sae_id` of a local copy `path` of a release in
    that conversion's layout. `section`: the config section that named it (sae.pretrained, or
    sae.transcoders for the transcoders of sae.kind both)."""

    site: str
    layer: int
    release: str | None = None
    sae_id: str | None = None
    path: str | None = None
    format: str = SAELENS_FORMAT
    neuronpedia_id: str | None = None  # the config's (a release's own is read when it loads)
    section: str = "sae.pretrained"

    @property
    def converted(self) -> bool:
        """A local copy of a release in its own layout, loaded through its SAELens conversion."""
        return self.path is not None and self.format != SAELENS_FORMAT

    @property
    def key(self) -> str:
        """The config key that named it."""
        return f"{self.section}.path" if self.path is not None else f"{self.section}.sae_id"

    @property
    def label(self) -> str:
        """How messages name it: the directory (and the file or folder within a release's
        layout), or the release and its SAE id."""
        if self.path is None:
            return f"{self.release} {self.sae_id}"
        return f"{self.path} {self.sae_id}" if self.converted else self.path

    @property
    def hook(self) -> str:
        return hook_name(self.site, self.layer)

    def describe(self) -> dict[str, Any]:
        """Its source, for metrics.json and prefetch.json."""
        out = {"release": self.release, "sae_id": self.sae_id, "path": self.path}
        return out | ({"format": self.format} if self.converted else {})


def expand(template: str, site: str, layer: int, key: str) -> str:
    try:
        return template.format(layer=layer, site=site)
    except (ValueError, KeyError, IndexError) as err:
        raise ConfigError(f"{key}: template {template!r} does not format ({err})") from None


def section_of(config: Mapping[str, Any], site: str) -> str:
    """The config section naming the published dictionary at `site`: sae.transcoders for the
    transcoders (mlp_out) where sae.transcoders.source is set (sae.kind both, or that run's
    transcoders alone: dictionary_sources.part), else sae.pretrained."""
    apart = (config["sae"].get("transcoders") or {}).get("source")
    return "sae.transcoders" if site == "mlp_out" and apart else "sae.pretrained"


def dictionary_for(config: Mapping[str, Any], site: str, layer: int) -> Dictionary:
    """The dictionary that fills (site, layer): the templates of its section (section_of)
    filled in."""
    section = section_of(config, site)
    p = config["sae"][section.split(".")[1]]
    layout = p.get("format") or SAELENS_FORMAT
    np_id = p.get("neuronpedia_id")
    np_id = expand(np_id, site, layer, f"{section}.neuronpedia_id") if np_id else None
    common = {"neuronpedia_id": np_id, "section": section}
    if p.get("path") is not None:
        path = expand(p["path"], site, layer, f"{section}.path")
        sae_id = p.get("sae_id")
        if layout != SAELENS_FORMAT:
            if not sae_id:
                raise ConfigError(
                    f"{section}.sae_id: {section}.format {layout} needs sae_id, the file or folder "
                    "within the release's copy at path (e.g. layer_{layer}.safetensors)"
                )
            sae_id = expand(sae_id, site, layer, f"{section}.sae_id")
        return Dictionary(site, int(layer), sae_id=sae_id, path=path, format=layout, **common)
    if not p.get("release") or not p.get("sae_id"):
        raise ConfigError(f"{section}: names neither path nor release and sae_id")
    sae_id = expand(p["sae_id"], site, layer, f"{section}.sae_id")
    return Dictionary(site, int(layer), release=p["release"], sae_id=sae_id, **common)


def dictionaries(config: Mapping[str, Any]) -> list[Dictionary]:
    """The published dictionary of every configured site and layer whose source is published
    (sae.source pretrained; with sae.kind both, the transcoders' sae.transcoders.source)."""
    return [
        dictionary_for(config, s, int(n))
        for s in dictionary_sites(config)
        if dictionary_sources.source_of(config, s).changes_dictionaries("sae.pretrained")
        for n in config["layers"]
    ]


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
        "d_out": cfg.get("d_out"),
        "k": cfg.get("k"),  # TopK and BatchTopK: latents active at a position
        "architecture": cfg.get("architecture"),
        "hook_name": get("hook_name", "hook_point"),
        "hook_head_index": get("hook_head_index", "hook_point_head_index"),
        "hook_name_out": get("hook_name_out"),
        # A Hugging Face module a converted release read (Gemma Scope 2's MLP-norm output).
        "hf_hook_name": get("hf_hook_name"),
        "neuronpedia_id": get("neuronpedia_id"),
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
    neuronpedia_id: str | None = None  # the directory's `neuronpedia:` of this SAE id


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
        found.get("neuronpedia"),
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


# --- releases in their own layouts (SAELens's conversions) ----------------------------------------
# A release SAELens converts when it loads it (pretrained_saes.yaml's conversion_func), read by
# SAELens's own conversion: its config function (read here, for the checks and the plans: it
# reads only the small files) and its loader (the job). Both fetch every file through
# huggingface_hub's hf_hub_download, and gemma_3's reads a safetensors file's tensor shapes with
# HTTP range requests even where the file is cached, which jobs (offline) cannot do: for the
# duration of a call the two names are given the files on disk instead (a local copy of the
# release's repository, or the hub cache), and the shapes from the file's own header.
CONVERSIONS = ("mwhanna_transcoder", "gemma_3")  # the schema's enum of sae.pretrained.format
LOCAL_REPO = "circuitflow-local/release"  # the repo id a local copy is loaded under


@contextmanager
def conversion_files(
    root: Path | None = None,
    cache_dir: Path | None = None,
    local_only: bool = False,
    read: list | None = None,
) -> Iterator[Any]:
    """SAELens's pretrained loaders module with its files read from `root`, a local copy of a
    release's repository (a file missing there is huggingface_hub's EntryNotFoundError, as the
    conversions expect), or, `root` None, through hf_hub_download into `cache_dir` (None: the
    environment's cache; `local_only`: from the cache alone); a safetensors file's tensor
    shapes from its header on disk. `read`, where given, gets each file's path."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError
    from sae_lens.loading import pretrained_sae_loaders as loaders

    def download(repo_id: str, filename: str, subfolder: str | None = None, **kwargs) -> str:
        name = f"{subfolder}/{filename}" if subfolder else filename
        if root is None:
            path = hf_hub_download(repo_id, name, revision=kwargs.get("revision"),
                                   cache_dir=cache_dir, local_files_only=local_only)  # fmt: skip
        else:
            path = Path(root) / name
            if not path.is_file():
                raise EntryNotFoundError(f"{path}: no such file in the release's copy")
        if read is not None and str(path) not in read:
            read.append(str(path))
        return str(path)

    def shapes(repo_id: str, filename: str) -> dict[str, list[int]]:
        from circuitflow.inputs import safetensors_shapes

        return safetensors_shapes(download(repo_id, filename))

    saved = loaders.hf_hub_download, loaders.get_safetensors_tensor_shapes
    loaders.hf_hub_download, loaders.get_safetensors_tensor_shapes = download, shapes
    try:
        yield loaders
    finally:
        loaders.hf_hub_download, loaders.get_safetensors_tensor_shapes = saved


@functools.cache
def converted_cfg(conversion: str, repo_id: str, folder: str, root: str | None = None,
                  cache_dir: str | None = None) -> dict:  # fmt: skip
    """The SAELens config dict of `folder` of a release in `conversion`'s layout, by that
    conversion's config function: of the local copy `root`, or (root None) of `repo_id` in the
    hub cache `cache_dir`, without the network. SAELens's and huggingface_hub's errors where it
    cannot be read (a file not cached, a layout that is not the conversion's)."""
    cache = Path(cache_dir) if cache_dir else None
    with conversion_files(Path(root) if root else None, cache, local_only=True) as loaders:
        getter = loaders.NAMED_PRETRAINED_SAE_CONFIG_GETTERS[conversion]
        return getter(repo_id, folder, device="cpu")


def converted_view(d: Dictionary, hf_cache: str | None = None) -> dict[str, Any] | None:
    """The cfg_view of a dictionary SAELens converts: a local copy in a release's layout
    (InputError naming it where it cannot be read), or a release whose files the hub cache
    holds (None where it does not: prefetch_saes fetches them, and checks them)."""
    if d.converted:
        root = Path(d.path)
        if not root.is_dir():
            raise InputError(f"{root}: no such directory (a copy of a {d.format} release)")
        try:
            return cfg_view(converted_cfg(d.format, LOCAL_REPO, d.sae_id, str(root)))
        except Exception as err:  # noqa: BLE001 - SAELens's conversions raise many kinds
            raise InputError(
                f"{root}: not a {d.format} release's layout for {d.sae_id} ({first_line(err)})"
            ) from None
    rel = resolve_release(d.release, d.sae_id)
    if rel.conversion_func not in CONVERSIONS:
        return None
    # Nothing of the repository cached (before prefetch_saes, e.g. a login node's first dry
    # run): the conversion could read nothing, so SAELens (and torch: 15 CPU-s of imports
    # in every Snakemake process) is not imported to find that out.
    if cached_revision(rel.repo_id, hf_cache) is None:
        return None
    try:
        cfg = converted_cfg(rel.conversion_func, rel.repo_id, rel.folder, None,
                            str(hub_cache_dir(hf_cache)))  # fmt: skip
    except Exception:  # noqa: BLE001 - not (all) in the cache yet: the prefetch checks it
        return None
    return cfg_view(cfg)


def first_line(err: BaseException) -> str:
    """An exception's first line (its type where it has no text), for one-line messages."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def view_of(d: Dictionary, hf_cache: str | None = None) -> dict[str, Any] | None:
    """What dictionary `d`'s config says, read without its weights: a local directory's
    (InputError where it is not one), a release's where the hub cache holds it (None where it
    does not yet); its Neuronpedia id the config's, else its own, else its release's."""
    if d.path is not None:
        view = converted_view(d) if d.converted else read_local(d.path)
    else:
        rel = resolve_release(d.release, d.sae_id)
        view = release_view(rel, hf_cache) if rel.conversion_func is None else converted_view(
            d, hf_cache)  # fmt: skip
        if view is not None and rel.neuronpedia_id and not view.get("neuronpedia_id"):
            view["neuronpedia_id"] = rel.neuronpedia_id
    if view is not None and d.neuronpedia_id:
        view["neuronpedia_id"] = d.neuronpedia_id
    return view
