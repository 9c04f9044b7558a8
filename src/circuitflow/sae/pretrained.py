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
release's model in SAELens's directory) is the run's (for a local directory, the model
`model.same_as` says it holds: circuitflow.model.same_as). `check_config` checks all it can
without loading weights when the config resolves (a local directory's cfg.json; a release's
cfg.json where the Hugging Face cache holds it); the prefetch_saes localrule and the
pretrained_sae job check the loaded dictionary again, against the model's own `d_model`, and its
weights for NaN and infinite values (check_finite), before any work. Every refusal is one line
naming the key or file, the dictionary and what differs.

Nothing here imports torch or SAELens at module level: the config check runs in the Snakemake
process. The stage that evaluates and writes the dictionaries is `sae.pretrained_stage`.
"""

from __future__ import annotations

import dataclasses
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
from circuitflow.nodes import SITES, MlpInput, hook_name, mlp_hook, mlp_input, site_layer

# The dictionaries as records, their configs and releases (circuitflow.published, a floor
# module the planners read too), under the names the stage and its callers use.
from circuitflow.published import (  # noqa: F401
    CFG_FILE,
    LOCAL_REPO,
    SAELENS_FORMAT,
    SAVE_HINT,
    WEIGHTS_FILE,
    Dictionary,
    Release,
    cached_file,
    cached_revision,
    cfg_view,
    conversion_files,
    dictionaries,
    dictionary_for,
    expand,
    first_line,
    hub_cache_dir,
    read_local,
    release_directory,
    release_view,
    resolve_release,
    section_of,
    view_of,
)
from circuitflow.sites import dictionary_kind, dictionary_sites

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
# RunModel.from_config's `normalization` when the caller does not know the model's norms: None
# is a value (a TransformerLens checkpoint without norms, normalization_type null).
UNKNOWN: Any = object()


@dataclass(frozen=True)
class RunModel:
    """The model a dictionary must have been made for: its names and, where known, d_model."""

    name: str
    names: frozenset[str]
    d_model: int | None
    hub: bool  # a Hugging Face hub name (TransformerLens aliases may spell it otherwise)
    mlp_in: MlpInput = mlp_input()  # site mlp_in of the model as it is loaded
    # model.same_as: the model a local directory is a copy of (model.same_as checked it).
    same_as: str | None = None

    @property
    def local(self) -> bool:
        """A local directory (not a hub name, not the embedded model)."""
        return not self.hub and self.name != "embedded"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], d_model: int | None,
                    normalization: str | None = UNKNOWN) -> RunModel:  # fmt: skip
        """The config's model; `d_model` where known (None: not checked); `normalization`: its
        norms as loaded (the loaded model's normalization_type, None for a model without
        norms), or UNKNOWN: as planning reads the config's model (a job's section lacks the
        embedded model's, which has LayerNorm; a loaded model is checked again when a
        transcoder is adapted to it: adapt_transcoder)."""
        name = str(config["model"]["name"])
        names = {name}
        local = Path(name).expanduser()
        hub = name != "embedded" and not local.exists()
        if not hub and name != "embedded":
            names |= {str(local.resolve()), local.resolve().name}
        if normalization is UNKNOWN:
            normalization = "LN"  # the embedded model's
            if name != "embedded" or "embedded" in config:
                from circuitflow.model.architectures import model_cfg

                normalization = model_cfg(dict(config)).normalization_type
        same_as = config["model"].get("same_as") if not hub and name != "embedded" else None
        return cls(name, frozenset(names), d_model, hub, mlp_input(normalization), same_as)

    def matches(self, model_name: str) -> bool:
        """Whether a dictionary made for `model_name` was made for this model: the same name, or
        for a hub model (or a local copy of one, model.same_as) the same TransformerLens model
        under another alias (gpt2-small, gpt2)."""
        if model_name in self.names:
            return True
        hub_name = self.name if self.hub else self.same_as
        return hub_name is not None and same_model(model_name, hub_name)

    def not_made_for(self, made_for: str) -> str:
        """The problem of a dictionary made for another model, saying what would make a local
        directory that model (model.same_as)."""
        line = f"made for model {made_for!r}, not the run's model {self.name!r}"
        if self.local and self.same_as is not None:
            return f"{line} (model.same_as: {self.same_as})"
        if self.local:
            return f"{line}: set model.same_as: {made_for} if {self.name} is that model"
        return line


def same_model(a: str, b: str) -> bool:
    """Whether hub or TransformerLens names `a` and `b` name one model (aliases: gpt2-small and
    gpt2), by circuitflow's own table, else TransformerLens's (architectures.official_name)."""
    if a == b:
        return True
    from circuitflow.model.architectures import architecture_key, official_name

    key = architecture_key(a)
    if key is not None and key == architecture_key(b):
        return True
    official = official_name(a)
    return official is not None and official == official_name(b)


# --- a published transcoder's input against site mlp_in ------------------------------------------
# What a published transcoder's input hook held in its release's model: `normalised`, ln2's
# normalised residual before the norm's weight (site mlp_in itself), or `mlp`, the tensor the MLP
# module received, which is after the norm's weight unless that model was loaded with fold_ln
# (which folds the weight into the MLP). circuit-tracer's `blocks.L.mlp.hook_in` is a hook it
# adds on the MLP module's input (TransformerLens's HookedTransformer has none). SAELens names
# Gemma Scope 2's input `blocks.L.hook_mlp_in`, which in TransformerLens is the residual before
# the norm, but its hf_hook_name is the pre-MLP norm's output: that is what it read. Hugging
# Face's pre-MLP norm is `pre_feedforward_layernorm` (Gemma) or `post_attention_layernorm`
# (Llama, Qwen).
HF_PRE_MLP_NORMS = ("pre_feedforward_layernorm", "post_attention_layernorm")


def transcoder_reads(view: Mapping[str, Any], layer: int,
                     mlp_in: MlpInput | None = None) -> str | None:  # fmt: skip
    """What a published transcoder's input hook read at `layer` of a model whose site mlp_in is
    `mlp_in`: `normalised` (that site: ln2's normalised residual, or in a model without norms
    hook_resid_mid, what the MLP reads), `mlp` (see above), or None where it is not layer
    `layer`'s MLP input. `mlp_in` None: a model with LayerNorm."""
    hook, hf = view.get("hook_name"), view.get("hf_hook_name") or ""
    if hook == f"blocks.{layer}.{(mlp_in or mlp_input()).hook}":
        return "normalised"
    if hook == f"blocks.{layer}.mlp.hook_in":
        return "mlp"
    hf_norms = {f"model.layers.{layer}.{norm}.output" for norm in HF_PRE_MLP_NORMS}
    if hook == f"blocks.{layer}.hook_mlp_in" and hf in hf_norms:
        return "mlp"
    return None


def read_after_norm_weight(view: Mapping[str, Any]) -> bool:
    """Whether a transcoder that read the MLP's input read it after the norm's weight: a Hugging
    Face module's output is (Hugging Face never folds), else model_from_pretrained_kwargs'
    fold_ln said no (TransformerLens's from_pretrained folds by default)."""
    if view.get("hf_hook_name"):
        return True
    return not (view.get("model_from_pretrained_kwargs") or {}).get("fold_ln", True)


def folds_norm(view: Mapping[str, Any], layer: int, mlp_in: MlpInput) -> bool:
    """Whether transcoder `view` reads site mlp_in of a model loaded as `mlp_in` says only with
    the pre-MLP norm's weight folded into its encoder (it read the MLP's input after that
    weight, which the model applies after site mlp_in's hook). ValueError saying what differs
    where the model as loaded cannot give the input it read: its norms folded into the MLPs
    (the weight is gone), or a hook that is not layer `layer`'s MLP input."""
    reads = transcoder_reads(view, layer, mlp_in)
    if reads is None:
        raise ValueError(
            f"input hook {view.get('hook_name')} is not layer {layer}'s MLP input (the pipeline "
            f"reads blocks.{layer}.{mlp_in.hook}; blocks.{layer}.mlp.hook_in and a Hugging Face "
            "pre-MLP norm's output are taken too)"
        )
    after_weight = reads == "mlp" and read_after_norm_weight(view)
    if after_weight and mlp_in == mlp_input(None):
        return False  # no norm: the MLP's input is site mlp_in itself, nothing to fold
    if after_weight and not mlp_in.norm_after:
        raise ValueError(
            "read the MLP's input after its norm's weight (its model loaded with fold_ln "
            "False), but the run's model is loaded with its norms folded into the MLPs, so that "
            "input is not there to read: load the model unfolded"
        )
    return after_weight


def fold_norm(sae, weight, bias=None) -> None:
    """Make transcoder `sae`, which read the MLP's input x = w * n + b (the norm's weight w and
    LayerNorm's bias b after the normalised residual n), read n, site mlp_in: x W_enc + b_enc =
    n (w W_enc) + (b W_enc + b_enc), and a skip term x W_skip^T = n (W_skip w)^T + b W_skip^T,
    its constant moved into b_dec. Exact: every feature and the output are unchanged."""
    import torch

    with torch.no_grad():
        w = weight.detach().double().to(sae.W_enc.device)
        enc = sae.W_enc.data.double()
        if bias is not None:
            b = bias.detach().double().to(enc.device)
            sae.b_enc.data += (b @ enc).to(sae.b_enc.dtype)
        sae.W_enc.data.copy_((w[:, None] * enc).to(sae.W_enc.dtype))
        if getattr(sae, "W_skip", None) is not None:
            skip = sae.W_skip.data.double()  # [d_out, d_in]
            if bias is not None:
                sae.b_dec.data += (b @ skip.T).to(sae.b_dec.dtype)
            sae.W_skip.data.copy_((skip * w[None, :]).to(sae.W_skip.dtype))


# --- whether a dictionary's config fits the run ---------------------------------------------------
def differences(
    view: Mapping[str, Any],
    site: str,
    layer: int,
    run: RunModel,
    release_model: str | None = None,
    normalisation: bool = True,
    kind: str = "sae",
) -> list[str]:
    """What keeps a dictionary from filling (site, layer) of this run as a dictionary of `kind`
    ([] when it fits): its hooks, d_in (and a transcoder's d_out), model, the norm folding its
    model was loaded with (a transcoder's input) and, where `normalisation`, a run-time input
    normalisation that attribution's splice cannot carry."""
    problems = []
    hook = view.get("hook_name")
    if kind == "transcoder":
        problems += _transcoder_differences(view, layer, run)
    elif view.get("hook_name_out"):
        problems.append(f"a transcoder ({hook} -> {view['hook_name_out']}), not an SAE")
    elif "hook_name" in view and not hook:
        problems.append("names no hook (metadata.hook_name)")
    elif hook and hook != (want := hook_name(site, layer)):
        try:
            s, l = site_layer(hook)  # noqa: E741
            where = f"site {s}, layer {l}: list {s} in sites and {l} in layers to use it"
        except ValueError:
            where = f"not a hook site the pipeline splices: sites are {', '.join(SITES)}"
        problems.append(f"hook {hook} ({where}) is not {want} (site {site}, layer {layer})")
    if view.get("hook_head_index") is not None:
        problems.append(f"reads one attention head (hook_head_index {view['hook_head_index']})")
    for dim in ("d_in", "d_out") if kind == "transcoder" else ("d_in",):
        value = view.get(dim)
        if run.d_model is not None and value is not None and int(value) != run.d_model:
            problems.append(f"{dim} {value} is not the model's d_model {run.d_model}")
    for made_for in dict.fromkeys(filter(None, (view.get("model_name"), release_model))):
        if not run.matches(str(made_for)):
            problems.append(run.not_made_for(str(made_for)))
    norm = view.get("normalize_activations", "none")
    if normalisation and norm != "none":
        problems.append(
            f"normalize_activations {norm!r} rescales its input at run time (the pipeline "
            "needs 'none': save it with save_inference_model, which folds a scaling factor)"
        )
    return problems


def _transcoder_differences(view: Mapping[str, Any], layer: int, run: RunModel) -> list[str]:
    if "hook_name" in view and not view.get("hook_name_out"):
        return [f"an SAE ({view.get('hook_name')}), not a transcoder (no hook_name_out)"]
    problems = []
    out = view.get("hook_name_out")
    if out is not None and out != mlp_hook(layer):
        problems.append(f"output hook {out} is not layer {layer}'s MLP output {mlp_hook(layer)}")
    if view.get("hook_name") is not None:
        try:
            folds_norm(view, layer, run.mlp_in)
        except ValueError as err:
            problems.append(str(err))
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
    files: list[str] = dataclasses.field(default_factory=list)  # a release's or copy's, as read


def load(d: Dictionary, hf_cache: str | None, device: str, offline: bool | None = True) -> Loaded:
    """Load dictionary `d` in float32 on `device`: a local directory in SAELens's format (after
    checking it) with SAE.load_from_disk; a local copy of a release in its own layout through
    that release's SAELens conversion; a release with SAE.from_pretrained from the hub cache,
    offline unless `offline` is False or None (the prefetch: None leaves the environment's
    setting). Its Neuronpedia id the config's, else its own. InputError in one line when it
    cannot be had (a release not in the cache: run the prefetch rule)."""
    from sae_lens import SAE

    if d.path is not None and not d.converted:
        read_local(d.path)
        try:
            sae = SAE.load_from_disk(d.path, device=device, dtype="float32")
        except Exception as err:  # noqa: BLE001 - shapes against cfg.json, an unknown architecture
            raise InputError(
                f"{d.path}: SAELens cannot load this dictionary ({first_line(err)})"
            ) from None
        return _loaded(d, sae, None)
    if d.converted:
        view_of(d)  # the layout checked, one line naming it, before any weight is read
        files: list[str] = []
        with conversion_files(Path(d.path), read=files) as loaders:
            converter = loaders.NAMED_PRETRAINED_SAE_LOADERS[d.format]
            try:
                sae = SAE.from_pretrained(LOCAL_REPO, d.sae_id, device=device, dtype="float32",
                                          converter=converter)  # fmt: skip
            except Exception as err:  # noqa: BLE001 - the conversion's errors, of many kinds
                raise InputError(
                    f"{d.key}: {d.label}: SAELens's {d.format} conversion cannot load it "
                    f"({first_line(err)})"
                ) from None
        loaded = _loaded(d, sae, None)
        loaded.files = files
        return loaded
    rel = resolve_release(d.release, d.sae_id)
    files = []
    with hub(hf_cache, offline) as cache, conversion_files(read=files):
        # conversion_files: gemma_3's config reads a file's tensor shapes over HTTP even where
        # the cache holds it; here they come from the cached file (published.conversion_files).
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
                f"{first_line(err)})"
            ) from None
        revision = cached_revision(rel.repo_id, hf_cache)
    loaded = _loaded(d, sae, rel, revision)
    loaded.files = files
    kwargs = loaded.view["model_from_pretrained_kwargs"] | rel.model_kwargs
    loaded.view["model_from_pretrained_kwargs"] = kwargs
    return loaded


def _loaded(d: Dictionary, sae, release: Release | None, revision: str | None = None) -> Loaded:
    """The loaded dictionary in eval mode with its view; the config's Neuronpedia id written
    into its metadata (it is saved with it). Its weights made contiguous: a conversion may
    hand one over transposed (mwhanna_transcoder's W_enc), which safetensors cannot save."""
    for p in sae.parameters():
        p.data = p.data.contiguous()
    if d.neuronpedia_id:
        sae.cfg.metadata.neuronpedia_id = d.neuronpedia_id
    return Loaded(sae.eval(), cfg_view(sae.cfg.to_dict()), release, revision)


def check_loaded(d: Dictionary, loaded: Loaded, run: RunModel, kind: str = "sae") -> None:
    """Refuse, in one line naming the dictionary, a loaded dictionary that does not fit the run
    as a dictionary of `kind`."""
    release_model = loaded.release.model if loaded.release else None
    problems = differences(loaded.view, d.site, d.layer, run, release_model, kind=kind)
    if problems:
        raise InputError(f"{d.key}: {d.label}: {'; '.join(problems)}")


def weight_files(d: Dictionary, loaded: Loaded | None = None) -> list[Path]:
    """The safetensors files dictionary `d`'s weights are read from: a local directory's
    sae_weights.safetensors, a local copy's file or folder (sae_id within path), else those a
    release's loading read (`loaded.files`: the hub cache's)."""
    if d.path is not None and not d.converted:
        return [Path(d.path) / WEIGHTS_FILE]
    if d.converted:
        within = Path(d.path) / d.sae_id
        return [within] if within.is_file() else sorted(within.rglob("*.safetensors"))
    return [Path(f) for f in (loaded.files if loaded else []) if f.endswith(".safetensors")]


def check_finite(d: Dictionary, loaded: Loaded | None = None) -> None:
    """Refuse, in one line naming the dictionary, the file and the tensor, a dictionary whose
    weights hold NaN or infinite values (inputs.nonfinite: tensor by tensor, memory bounded):
    prefetch_saes checks each release it fetches, a pretrained_sae job each local dictionary
    before the model loads and each release as it loads."""
    from circuitflow import inputs

    for path in weight_files(d, loaded):
        if path.suffix == ".safetensors" and (found := inputs.nonfinite(path)):
            raise InputError(f"{d.key}: {d.label}: {inputs.nonfinite_line(path, found)}")


def adapt_transcoder(sae, view: Mapping[str, Any], layer: int, model) -> bool:
    """Make a published transcoder read site mlp_in of `model` as it is loaded: the pre-MLP
    norm's weight (and bias) folded into its encoder where it read the MLP's input after them
    (`folds_norm`), and its hooks the pipeline's (site mlp_in, the MLP's output), so every
    stage splices it as it splices one trained here. Returns whether the norm was folded.
    ValueError (folds_norm's) where the model cannot give what it read."""
    fold = folds_norm(view, layer, mlp_input(model.cfg.normalization_type))
    if fold:
        ln2 = model.blocks[layer].ln2
        fold_norm(sae, ln2.w, getattr(ln2, "b", None))
    sae.cfg.metadata.hook_name = hook_name("mlp_in", layer, model.cfg.normalization_type)
    sae.cfg.metadata.hook_name_out = mlp_hook(layer)
    if fold:  # written without it: the transcoder now reads the model as the pipeline loads it
        kwargs = dict(sae.cfg.metadata.model_from_pretrained_kwargs or {})
        kwargs.pop("fold_ln", None)
        sae.cfg.metadata.model_from_pretrained_kwargs = kwargs
    return fold


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
def check_config(config: dict, d_model: int | None, origin: Callable[[str], Path]) -> None:
    """The published dictionaries' sections (sae.pretrained; sae.transcoders with sae.kind
    both) when the config resolves: each used by a published source and only then; exactly one
    of release with sae_id, or path (a conversion's layout with sae_id); the templates'
    placeholders; a relative path made absolute (against `origin(section)`, the folder of the
    config file that set it, as prompt files are); then every dictionary that can be read
    without loading weights (a local directory, a local copy of a release, a release's config
    in the hub cache) checked against the run (`d_model`: the model's where it is known without
    loading it): one line naming the key, the dictionary and what differs."""
    sae = config["sae"]
    published_sites = [
        s for s in dictionary_sites(config)
        if dictionary_sources.source_of(config, s).changes_dictionaries("sae.pretrained")
    ]  # fmt: skip
    used = {section_of(config, site): site for site in published_sites}
    for section in ("sae.pretrained", "sae.transcoders"):
        p = sae[section.split(".")[1]]
        given = [k for k in ("release", "sae_id", "path", "neuronpedia_id") if p.get(k) is not None]
        if section not in used:
            if given:
                whose = "sae.transcoders.source" if section == "sae.transcoders" else "sae.source"
                value = sae["transcoders"]["source"] if whose != "sae.source" else sae["source"]
                raise ConfigError(
                    f"{section}.{given[0]}: only used with {whose} pretrained, not {value!r}"
                )
            continue
        sites = [used[section]] if section == "sae.transcoders" else config["sites"]
        _check_section(p, section, sites, config["layers"], origin)
    run = RunModel.from_config(config, d_model)
    hf_cache = config["model"]["hf_cache"]
    for d in dictionaries(config):
        where = f" (site {d.site}, layer {d.layer})"
        release_model = None
        if d.path is not None:
            try:
                view = view_of(d)
            except InputError as err:
                raise ConfigError(f"{d.key}: {err}{where}") from None
        else:
            rel = resolve_release(d.release, d.sae_id, where)
            release_model = rel.model
            view = view_of(d, hf_cache) or {}  # not cached yet: the release's model is checked
        kind = dictionary_kind(config, d.site)
        problems = differences(view, d.site, d.layer, run, release_model, d.path is not None, kind)
        if problems:
            raise ConfigError(f"{d.key}: {d.label}: {'; '.join(problems)}")


def _check_section(p: dict, section: str, sites, layers, origin: Callable[[str], Path]) -> None:
    """One section's keys (see check_config); a relative path made absolute in place."""
    if p["path"] is not None and p["release"] is not None:
        raise ConfigError(
            f"{section}.path: give either path (local directories) or release and sae_id, not both"
        )
    layout = p.get("format") or SAELENS_FORMAT
    whose = "sae.transcoders.source" if section == "sae.transcoders" else "sae.source"
    if p["path"] is not None and layout == SAELENS_FORMAT and p["sae_id"] is not None:
        raise ConfigError(
            f"{section}.sae_id: with path in SAELens's format (format saelens) each directory is "
            "the dictionary; sae_id names a file or folder of a release's copy (format "
            "mwhanna_transcoder or gemma_3)"
        )
    if p["path"] is None:
        if layout != SAELENS_FORMAT:
            raise ConfigError(
                f"{section}.format: {layout} describes a local copy (path); a release's layout "
                "is the release's own"
            )
        if p["release"] is None and p["sae_id"] is None:
            raise ConfigError(
                f"{section}: {whose} pretrained needs release and sae_id (a SAELens "
                "pretrained release, e.g. gpt2-small-res-jb and blocks.{layer}.hook_resid_pre) "
                "or path (a directory template in SAELens's format)"
            )
        for key, other in (("release", "sae_id"), ("sae_id", "release")):
            if p[key] is None:
                raise ConfigError(f"{section}.{key}: required with {section}.{other}")
    templates = ["path"] if p["path"] is not None and layout == SAELENS_FORMAT else ["sae_id"]
    for key in templates:
        check_template(p[key], f"{section}.{key}", sites, layers)
    if p["path"] is not None:
        path = Path(p["path"]).expanduser()
        p["path"] = str(path if path.is_absolute() else Path(origin(section)).absolute() / path)
