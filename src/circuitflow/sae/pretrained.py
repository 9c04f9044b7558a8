"""Published dictionaries (`sae.source: pretrained`): the checks that each fits the run, and
loading it. Which dictionary fills each site and layer, its cfg.json and a release's place on the
hub are records in circuitflow.published (a floor module the run's description reads too),
re-exported here under the names the stage and its callers use.

`sae.pretrained` names either a SAELens pretrained release and an SAE id template (`release`,
`sae_id`: `SAE.from_pretrained(release, sae_id)`, e.g. gpt2-small-res-jb and
`blocks.{layer}.hook_resid_pre`) or a local directory template in SAELens's format (`path`, e.g.
`/data/saes/{site}/layer_{layer}`); templates take `{layer}` and `{site}`. A dictionary fits
the run when its hook (`metadata.hook_name`) is the site and layer it fills
(`blocks.{layer}.hook_{site}`: gpt2-small-res-jb's `hook_resid_pre` is site resid_pre), its
`d_in` is the model's `d_model` and the model it was made for (`metadata.model_name`, and a
release's model in SAELens's directory) is the run's. `check_config` checks all it can without
loading weights when the config resolves (a local directory's cfg.json; a release's cfg.json
where the Hugging Face cache holds it); the prefetch_saes localrule and the pretrained_sae job
check the loaded dictionary again, against the model's own `d_model`, before any work. Every
refusal is one line naming the key or file, the dictionary and what differs.

Nothing here imports torch or SAELens at module level: the config check runs in the Snakemake
process. The stage that evaluates and writes the dictionaries is `sae.pretrained_stage`.
"""

from __future__ import annotations

import logging
import os
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitflow import dictionary_sources
from circuitflow.errors import ConfigError, InputError
from circuitflow.nodes import SITES, hook_name, site_layer

# The dictionaries as records, their configs and releases (circuitflow.published, a floor
# module the planners read too), under the names the stage and its callers use.
from circuitflow.published import (  # noqa: F401
    CFG_FILE,
    SAVE_HINT,
    WEIGHTS_FILE,
    Dictionary,
    Release,
    cached_file,
    cached_revision,
    cfg_view,
    dictionaries,
    dictionary_for,
    expand,
    hub_cache_dir,
    read_local,
    release_directory,
    release_view,
    resolve_release,
)

log = logging.getLogger(__name__)

PLACEHOLDERS = ("layer", "site")
# model_from_pretrained_kwargs that leave the activations at every hook site unchanged (they
# refold LayerNorm weights, the unembedding or the attention factors): nothing to adapt.
NEUTRAL_MODEL_KWARGS = frozenset(
    {
        "fold_ln", "center_unembed", "fold_value_biases", "refactor_factored_attn_matrices",
        "dtype", "torch_dtype", "device", "n_devices", "move_to_device", "first_n_layers",
        "default_prepend_bos", "default_padding_side", "trust_remote_code",
    }
)  # fmt: skip
# center_writing_weights: TransformerLens subtracts each written vector's mean over d_model
# (LayerNorm models only), so the SAE read mean-centred activations (fold_centering).
CENTERING_KWARG = "center_writing_weights"


# --- the templates ------------------------------------------------------------------------------
def check_template(template: str, key: str, sites: Sequence[str], layers: Sequence[int]) -> None:
    """Placeholders {layer} and {site} only, and each that tells the dictionaries apart present."""
    if not template.strip():
        raise ConfigError(f"{key}: empty template")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise ConfigError(f"{key}: {template!r} is not a template ({err})") from None
    for field in fields:
        if field not in PLACEHOLDERS:
            raise ConfigError(
                f"{key}: unknown placeholder {{{field}}} in {template!r}; templates take "
                "{layer} and {site}"
            )
    for name, values in (("layer", layers), ("site", sites)):
        if len(values) > 1 and name not in fields:
            raise ConfigError(
                f"{key}: {template!r} has no {{{name}}} but the config lists {len(values)} "
                f"{name}s: each would get the same dictionary"
            )


# --- the run's model ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunModel:
    """The model a dictionary must have been made for: its names and, where known, d_model."""

    name: str
    names: frozenset[str]
    d_model: int | None
    hub: bool  # a Hugging Face hub name (TransformerLens aliases may spell it otherwise)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], d_model: int | None) -> RunModel:
        """The config's model; `d_model` where known (None: not checked)."""
        name = str(config["model"]["name"])
        names = {name}
        local = Path(name).expanduser()
        hub = name != "embedded" and not local.exists()
        if not hub and name != "embedded":
            names |= {str(local.resolve()), local.resolve().name}
        return cls(name, frozenset(names), d_model, hub)

    def matches(self, model_name: str) -> bool:
        """Whether a dictionary made for `model_name` was made for this model: the same name, or
        for a hub model the same TransformerLens model under another alias (gpt2-small, gpt2)."""
        if model_name in self.names:
            return True
        if not self.hub:
            return False
        from circuitflow.model.architectures import architecture_key

        key = architecture_key(model_name)
        if key is not None and key == architecture_key(self.name):
            return True
        try:
            from transformer_lens.loading_from_pretrained import get_official_model_name

            return get_official_model_name(model_name) == get_official_model_name(self.name)
        except ValueError:  # not a TransformerLens name
            return False


# --- whether a dictionary's config fits the run ---------------------------------------------------
def differences(
    view: Mapping[str, Any],
    site: str,
    layer: int,
    run: RunModel,
    release_model: str | None = None,
    normalisation: bool = True,
) -> list[str]:
    """What keeps a dictionary from filling (site, layer) of this run ([] when it fits):
    its hook, d_in, model and, where `normalisation`, a run-time input normalisation that
    attribution's splice cannot carry."""
    problems = []
    want = hook_name(site, layer)
    hook = view.get("hook_name")
    if view.get("hook_name_out"):
        problems.append(f"a transcoder ({hook} -> {view['hook_name_out']}), not an SAE")
    elif "hook_name" in view and not hook:
        problems.append("names no hook (metadata.hook_name)")
    elif hook and hook != want:
        try:
            s, l = site_layer(hook)  # noqa: E741
            where = f"site {s}, layer {l}: list {s} in sites and {l} in layers to use it"
        except ValueError:
            where = f"not a hook site the pipeline splices: sites are {', '.join(SITES)}"
        problems.append(f"hook {hook} ({where}) is not {want} (site {site}, layer {layer})")
    if view.get("hook_head_index") is not None:
        problems.append(f"reads one attention head (hook_head_index {view['hook_head_index']})")
    d_in = view.get("d_in")
    if run.d_model is not None and d_in is not None and int(d_in) != run.d_model:
        problems.append(f"d_in {d_in} is not the model's d_model {run.d_model}")
    for made_for in dict.fromkeys(filter(None, (view.get("model_name"), release_model))):
        if not run.matches(str(made_for)):
            problems.append(f"made for model {made_for!r}, not the run's model {run.name!r}")
    norm = view.get("normalize_activations", "none")
    if normalisation and norm != "none":
        problems.append(
            f"normalize_activations {norm!r} rescales its input at run time (the pipeline "
            "needs 'none': save it with save_inference_model, which folds a scaling factor)"
        )
    return problems


# --- the Hugging Face cache ----------------------------------------------------------------------
@contextmanager
def hub(hf_cache: str | None, offline: bool | None) -> Iterator[Path]:
    """Point huggingface_hub at `model.hf_cache` (when set) and, when `offline`, keep it off the
    network, for this block. huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, when it is
    first imported (TransformerLens imports it), so its module constants are set here as well
    as the environment; both are restored after. Yields the hub cache directory."""
    from huggingface_hub import constants

    names = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")
    saved_env = {n: os.environ.get(n) for n in names}
    saved = {n: getattr(constants, n) for n in names}
    try:
        if hf_cache:
            home = Path(hf_cache).expanduser()
            for n, v in (("HF_HOME", home), ("HF_HUB_CACHE", home / "hub")):
                os.environ[n] = str(v)
                setattr(constants, n, str(v))
        if offline is not None:
            os.environ["HF_HUB_OFFLINE"] = "1" if offline else "0"
            constants.HF_HUB_OFFLINE = offline
        yield Path(constants.HF_HUB_CACHE)
    finally:
        for n, v in saved_env.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
        for n, v in saved.items():
            setattr(constants, n, v)


def prefetch_hint() -> str:
    return "run `snakemake prefetch_saes --configfile <your config>` on a machine with internet"


# --- loading --------------------------------------------------------------------------------------
@dataclass
class Loaded:
    """A dictionary as loaded for the run: the SAE (float32) and what the checks read."""

    sae: Any
    view: dict[str, Any]
    release: Release | None
    revision: str | None = None


def load(d: Dictionary, hf_cache: str | None, device: str, offline: bool | None = True) -> Loaded:
    """Load dictionary `d` in float32 on `device`: a local directory (after checking its format)
    with SAE.load_from_disk; a release with SAE.from_pretrained from the hub cache, offline
    unless `offline` is False or None (the prefetch: None leaves the environment's setting).
    InputError in one line when it cannot be had (a release not in the cache: run the
    prefetch rule)."""
    from sae_lens import SAE

    if d.path is not None:
        read_local(d.path)
        try:
            sae = SAE.load_from_disk(d.path, device=device, dtype="float32")
        except Exception as err:  # noqa: BLE001 - shapes against cfg.json, an unknown architecture
            raise InputError(
                f"{d.path}: SAELens cannot load this dictionary ({_first_line(err)})"
            ) from None
        return Loaded(sae.eval(), cfg_view(sae.cfg.to_dict()), None)
    rel = resolve_release(d.release, d.sae_id)
    with hub(hf_cache, offline) as cache:
        try:
            sae = SAE.from_pretrained(d.release, d.sae_id, device=device, dtype="float32")
        except Exception as err:  # noqa: BLE001 - huggingface_hub's and the converters' errors
            from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

            missing = isinstance(err, LocalEntryNotFoundError | OfflineModeIsEnabled)
            if missing and offline is not False:
                raise InputError(
                    f"{d.key}: {d.label} (hub repo {rel.repo_id}, folder {rel.folder}) is not in "
                    f"the Hugging Face cache {cache}; {prefetch_hint()}"
                ) from None
            raise InputError(
                f"{d.key}: cannot load {d.label} from {rel.repo_id} ({type(err).__name__}: "
                f"{_first_line(err)})"
            ) from None
        revision = cached_revision(rel.repo_id, hf_cache)
    view = cfg_view(sae.cfg.to_dict())
    view["model_from_pretrained_kwargs"] = view["model_from_pretrained_kwargs"] | rel.model_kwargs
    return Loaded(sae.eval(), view, rel, revision)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def check_loaded(d: Dictionary, loaded: Loaded, run: RunModel) -> None:
    """Refuse, in one line naming the dictionary, a loaded dictionary that does not fit."""
    release_model = loaded.release.model if loaded.release else None
    problems = differences(loaded.view, d.site, d.layer, run, release_model)
    if problems:
        raise InputError(f"{d.key}: {d.label}: {'; '.join(problems)}")


def model_kwargs_effect(
    view: Mapping[str, Any], normalization_type: str | None
) -> tuple[bool, list[str]]:
    """(whether to fold mean-centring into the encoder, the model_from_pretrained_kwargs whose
    effect on the activations is unknown) for a dictionary trained on a model TransformerLens
    loaded with `view`'s model_from_pretrained_kwargs; the pipeline loads models unprocessed.
    center_writing_weights changes the activations of LayerNorm models only (TransformerLens
    skips it for RMSNorm ones)."""
    kwargs = dict(view.get("model_from_pretrained_kwargs") or {})
    centre = bool(kwargs.pop(CENTERING_KWARG, False)) and normalization_type in ("LN", "LNPre")
    unknown = sorted(k for k in kwargs if k not in NEUTRAL_MODEL_KWARGS)
    return centre, unknown


def fold_centering(sae) -> None:
    """Make `sae` read the mean-centred activation P x (P = I - 11^T / d_in) from the raw one x:
    what it saw when trained on a model loaded with center_writing_weights, which subtracts
    each written vector's mean over d_model so every activation at a hook site arrives centred.
    The encoder becomes P W_enc, and b_enc absorbs the b_dec term P changes:
    (x - b_dec) P W_enc + b_enc' = (P x - b_dec) W_enc + b_enc. The features are then those
    the published dictionary gives on the processed model, and its reconstruction is the centred
    activation: the mean it leaves out is read by nothing downstream (every reader of the
    residual stream is a LayerNorm, which removes it), so the spliced losses are unchanged."""
    import torch

    if not isinstance(getattr(sae, "b_enc", None), torch.nn.Parameter):
        raise ValueError(
            f"trained with {CENTERING_KWARG}, which the pipeline folds only into encoders with "
            f"a b_enc (standard, TopK, JumpReLU), not {type(sae).__name__}'s"
        )
    with torch.no_grad():
        w = sae.W_enc.data.double()
        if sae.cfg.apply_b_dec_to_input:
            sae.b_enc.data -= (sae.b_dec.data.double().mean() * w.sum(0)).to(sae.b_enc.dtype)
        sae.W_enc.data.copy_((w - w.mean(0, keepdim=True)).to(sae.W_enc.dtype))
    # Written without it: the dictionary now reads the model as the pipeline loads it.
    kwargs = dict(sae.cfg.metadata.model_from_pretrained_kwargs or {})
    kwargs.pop(CENTERING_KWARG, None)
    sae.cfg.metadata.model_from_pretrained_kwargs = kwargs


# --- the config check -----------------------------------------------------------------------------
def check_config(config: dict, d_model: int | None, origin: Callable[[], Path]) -> None:
    """sae.source and sae.pretrained when the config resolves: exactly one of release with
    sae_id, or path; the templates' placeholders; a relative path made absolute (against
    `origin()`, the folder of the config file that set it, as prompt files are); then every
    dictionary that can be read without loading weights (a local directory, a release's cfg.json
    in the hub cache) checked against the run (`d_model`: the model's where it is known without
    loading it): one line naming the key, the dictionary and what differs."""
    sae = config["sae"]
    p = sae["pretrained"]
    given = [k for k in ("release", "sae_id", "path") if p.get(k) is not None]
    if not dictionary_sources.get(config).changes_dictionaries("sae.pretrained"):
        if given:
            raise ConfigError(
                f"sae.pretrained.{given[0]}: only used with sae.source "
                f"{' or '.join(dictionary_sources.reading('sae.pretrained'))}, "
                f"not {sae['source']!r}"
            )
        return
    if p["path"] is not None and (p["release"] is not None or p["sae_id"] is not None):
        raise ConfigError(
            "sae.pretrained.path: give either path (local directories) or release and sae_id, "
            "not both"
        )
    if p["path"] is None:
        if p["release"] is None and p["sae_id"] is None:
            raise ConfigError(
                f"sae.pretrained: sae.source {sae['source']} needs release and sae_id (a SAELens "
                "pretrained release, e.g. gpt2-small-res-jb and blocks.{layer}.hook_resid_pre) "
                "or path (a directory template in SAELens's format)"
            )
        for key, other in (("release", "sae_id"), ("sae_id", "release")):
            if p[key] is None:
                raise ConfigError(f"sae.pretrained.{key}: required with sae.pretrained.{other}")
    key = "path" if p["path"] is not None else "sae_id"
    check_template(p[key], f"sae.pretrained.{key}", config["sites"], config["layers"])
    if key == "path":
        path = Path(p["path"]).expanduser()
        p["path"] = str(path if path.is_absolute() else Path(origin()).absolute() / path)
    run = RunModel.from_config(config, d_model)
    hf_cache = config["model"]["hf_cache"]
    for d in dictionaries(config):
        where = f" (site {d.site}, layer {d.layer})"
        if d.path is not None:
            try:
                view = read_local(d.path)
            except InputError as err:
                raise ConfigError(f"sae.pretrained.path: {err}{where}") from None
            release_model = None
        else:
            rel = resolve_release(d.release, d.sae_id, where)
            view, release_model = release_view(rel, hf_cache), rel.model
            if view is None:  # not cached yet: the release's model is all there is to check
                view = {}
        problems = differences(view, d.site, d.layer, run, release_model, d.path is not None)
        if problems:
            raise ConfigError(f"{d.key}: {d.label}: {'; '.join(problems)}")
