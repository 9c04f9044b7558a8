"""The `sae:` config section as typed dataclasses (defaults: the schema's), and its checks
against the rest of the run that `config.resolve` calls before any job (`check`,
`check_pretrained`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from circuitflow import dictionary_sources
from circuitflow.description import trained_width
from circuitflow.errors import ConfigError
from circuitflow.sae import architectures
from circuitflow.sae.sparsity import SparsityControllerConfig
from circuitflow.schema import schema_defaults, typed
from circuitflow.sites import trains_transcoders

_TOP = schema_defaults()
_D = _TOP["sae"]
_J = _D["jumprelu"]


@dataclass
class JumpReLUConfig:
    """JumpReLU training knobs (``sae.jumprelu``), passed to SAELens's JumpReLUTrainingSAEConfig.

    Defaults differ from SAELens's ("step" loss, no pre-activation loss) on purpose. With the
    "step" L0 loss the penalty only ever pushes thresholds up, and Adam moves a threshold by ~lr
    per step whatever the size of its gradient, so once L0 undershoots the target no reduction of
    the coefficient brings it back (measured on the embedded default: L0 4.6 for a target of 16,
    coefficient 50x below its start). The "quadratic" loss, ``2/target * (l0 - target)^2`` per
    token, pushes thresholds down below the target, and the PI controller then only trims its
    stiffness; the pre-activation loss revives latents whose threshold has drifted above every
    pre-activation (the straight-through gradient is zero there, so they cannot come back alone).
    """

    init_threshold: float = _J["init_threshold"]
    bandwidth: float = _J["bandwidth"]
    sparsity_loss_mode: Literal["step", "tanh", "quadratic"] = _J["sparsity_loss_mode"]
    pre_act_loss_coefficient: float | None = _J["pre_act_loss_coefficient"]
    tanh_scale: float = _J["tanh_scale"]
    ste_to_input: bool = _J["ste_to_input"]
    # Steps without firing before a latent counts as dead for the pre-activation loss;
    # null means the trainer's dead window (sae.dead_window_tokens / sae.batch_size).
    dead_window_steps: int | None = _J["dead_window_steps"]


# Hooks each dictionary kind reads a row from: a transcoder its MLP's input and output; a run of
# both kinds is planned at the larger.
HOOKS_READ = {"sae": 1, "transcoder": 2, "both": 2}
TRAINERS = ("auto", "fast", "gpu", "saelens")  # the schema's enum of sae.trainer (a test checks)
_S, _P, _T = _D["stream"], _D["pretrained"], _D["transcoders"]


@dataclass
class StreamConfig:
    """Streaming training (``sae.stream``, for ``sae.source: stream``)."""

    layers_per_job: int | Literal["auto"] = _S["layers_per_job"]
    batch_contexts: int | None = _S["batch_contexts"]  # None: planned from memory


@dataclass
class PretrainedConfig:
    """Published dictionaries (``sae.pretrained``, for ``sae.source: pretrained``): templates
    with {layer} and {site}."""

    release: str | None = _P["release"]
    sae_id: str | None = _P["sae_id"]
    path: str | None = _P["path"]
    format: str = _P["format"]  # saelens, or a SAELens conversion (mwhanna_transcoder, gemma_3)
    neuronpedia_id: str | None = _P["neuronpedia_id"]


@dataclass
class TranscodersConfig(PretrainedConfig):
    """The transcoders of sae.kind both (``sae.transcoders``): their source (None:
    ``sae.source``) and, published, which ones (as ``sae.pretrained``)."""

    source: str | None = _T["source"]


@dataclass
class SAETrainConfig:
    """The ``sae:`` config block (schema: workflow/schemas, key ``sae``) with the master seed and
    device. The schema checks every value; `check` below the combinations."""

    # transcoder: mlp_in -> mlp_out. The schema's `auto` is resolved with the config
    # (resolve_kind); a section built without a run's config trains an SAE (__post_init__).
    kind: Literal["auto", "sae", "transcoder", "both"] = _D["kind"]
    source: str = _D["source"]  # a name in circuitflow.dictionary_sources (the schema's enum)
    stream: StreamConfig = field(default_factory=StreamConfig)
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)
    transcoders: TranscodersConfig = field(default_factory=TranscodersConfig)
    architecture: str = _D["architecture"]  # a key of sae.architectures.ARCHITECTURES
    expansion_factor: int = _D["expansion_factor"]
    d_sae: int | None = _D["d_sae"]
    k: int = _D["k"]
    target_l0: float = _D["target_l0"]
    l1_coefficient: float = _D["l1_coefficient"]
    controller: SparsityControllerConfig = field(default_factory=SparsityControllerConfig)
    jumprelu: JumpReLUConfig = field(default_factory=JumpReLUConfig)
    lr: float = _D["lr"]
    lr_warm_up_steps: int = _D["lr_warm_up_steps"]
    lr_decay_fraction: float = _D["lr_decay_fraction"]
    total_tokens: int = _D["total_tokens"]
    batch_size: int | Literal["auto"] = _D["batch_size"]  # auto: planned from the device's memory
    normalize_activations: Literal["none", "expected_average_only_in"] = _D["normalize_activations"]
    shuffle_buffer_tokens: int = _D["shuffle_buffer_tokens"]
    checkpoint_every_tokens: int = _D["checkpoint_every_tokens"]
    dead_window_tokens: int = _D["dead_window_tokens"]
    eval_contexts: int = _D["eval_contexts"]
    # auto: the trainer measured fastest on the device (sae.trainers.choose).
    trainer: Literal["auto", "fast", "gpu", "saelens"] = _D["trainer"]
    autocast: bool = _D["autocast"]
    compile: bool = _D["compile"]
    device: str = _TOP["device"]
    seed: int = _TOP["seed"]

    def __post_init__(self):
        if self.kind == "auto":  # no model to decide by: an SAE
            self.kind = "sae"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SAETrainConfig:
        """From the pipeline's config: the `sae` section with the master `seed` and `device`."""
        return cls.from_dict(config["sae"], device=config["device"], seed=config["seed"])

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, **extra: Any) -> SAETrainConfig:
        """From an `sae` section, whole or partial (`extra`: `device`, `seed`)."""
        return typed(cls, d, "sae", **extra)

    def trainer_on(self, device: str) -> str:
        """The trainer that trains this dictionary on `device` (sae.trainers.choose)."""
        from circuitflow.sae.trainer_choice import choose

        return choose(self, device).trainer

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check(config: dict, dims: dict[str, int]) -> None:
    """The `sae:` section's values that are each valid alone but cannot work together with the
    rest of the run: the trainer against the architecture, k or target_l0 against the width,
    sae.kind against the sites and the source (`check_transcoders`), the batch against the
    tokens. `dims`: the model's d_model and n_ctx where known without loading it
    (config.model_dims)."""
    sae, capture = config["sae"], config["capture"]
    d_model = dims["d_model"] if dims else None
    d_sae = (
        trained_width(sae["d_sae"], sae["expansion_factor"], d_model) if d_model else sae["d_sae"]
    )
    where = "sae.d_sae" if sae["d_sae"] else "sae.expansion_factor * the model's d_model"
    architecture = architectures.get(sae["architecture"])
    if sae["trainer"] in ("fast", "gpu") and not architecture.sparse_trainer:
        fast = [name for name, a in architectures.ARCHITECTURES.items() if a.sparse_trainer]
        raise ConfigError(
            f"sae.trainer: {sae['trainer']} trains {', '.join(fast)} only, not "
            f"{sae['architecture']}; use auto or saelens"
        )
    fixed_l0 = architecture.controlled_coefficient is None
    if d_sae is not None and fixed_l0 and sae["k"] > d_sae:
        raise ConfigError(
            f"sae.k: {sae['k']} latents per token cannot exceed the SAE's width ({where} = {d_sae})"
        )
    if d_sae is not None and not fixed_l0 and sae["target_l0"] >= d_sae:
        raise ConfigError(
            f"sae.target_l0: {sae['target_l0']} must be below the SAE's width ({where} = {d_sae})"
        )
    check_transcoders(config)
    batch = sae["batch_size"]
    if batch != "auto" and batch > sae["total_tokens"]:
        raise ConfigError(
            f"sae.batch_size: {batch} exceeds sae.total_tokens ({sae['total_tokens']}): "
            "not one training step"
        )
    reads_files = dictionary_sources.run_reads_activation_files(config)
    if batch != "auto" and reads_files and batch > capture["n_tokens"]:
        raise ConfigError(
            f"sae.batch_size: {batch} exceeds the activation rows captured "
            f"(capture.n_tokens = {capture['n_tokens']})"
        )


def resolve_kind(config: dict, embedded: bool) -> str:
    """sae.kind auto: both on the embedded model, so the laptop run shows the whole chain (SAEs
    that attribution and interventions splice, transcoders the per-prompt graphs replace the
    MLPs with); sae on a real model, where transcoders double the training (ask for them), for
    published dictionaries (say which are transcoders) and where a site is mlp_out (the
    transcoders' place)."""
    sae = config["sae"]
    if sae["kind"] != "auto":
        return sae["kind"]
    source = dictionary_sources.get(config)
    both = embedded and source.trains and "mlp_out" not in config["sites"]
    return "both" if both else "sae"


def check_transcoders(config: dict) -> None:
    """sae.kind: one its sources make; transcoder: one transcoder per layer, from mlp_in to
    mlp_out; both: SAEs at `sites` and the transcoders beside them, saved at mlp_out, which no
    SAE may take, from sae.transcoders.source where set (capture and stream not both: they
    size the token set differently)."""
    sae = config["sae"]
    kind = sae["kind"]
    apart = {k: v for k, v in (sae.get("transcoders") or {}).items() if v not in (None, "saelens")}
    if apart and kind != "both":
        first = "source" if "source" in apart else next(iter(apart))
        raise ConfigError(
            f"sae.transcoders.{first}: only with sae.kind both (SAEs and transcoders from "
            f"different sources), not {kind}; with sae.kind transcoder sae.source and "
            "sae.pretrained name the transcoders"
        )
    for source in dictionary_sources.used(config):
        if kind not in source.kinds:
            raise ConfigError(
                f"sae.source: {source.name!r} with sae.kind {kind}; {source.name} makes sae.kind "
                f"{' or '.join(source.kinds)} only: use sae.source "
                + " or ".join(dictionary_sources.making(kind))
            )
    trained = {s.name for s in dictionary_sources.used(config) if s.trains}
    if len(trained) > 1:
        raise ConfigError(
            f"sae.transcoders.source: {sae['transcoders']['source']} with sae.source "
            f"{sae['source']}: one run trains from one of capture and stream (they size the "
            "token set differently); take both from the same"
        )
    if not trains_transcoders(config):
        return
    if kind == "transcoder" and config["sites"] != ["mlp_out"]:
        raise ConfigError(
            f"sites: {config['sites']} with sae.kind transcoder; a transcoder predicts a layer's "
            "MLP output from its input: set sites: [mlp_out]"
        )
    if kind == "both" and "mlp_out" in config["sites"]:
        raise ConfigError(
            f"sites: {config['sites']} with sae.kind both; the transcoders are saved at "
            "saes/mlp_out/: leave mlp_out out of sites (the SAEs' sites)"
        )


def check_pretrained(config: dict, d_model: int | None, origin: Callable[[str], Path]) -> None:
    """Published dictionaries (sae.pretrained, sae.transcoders): the templates, and each
    dictionary that can be read without its weights, against the run
    (sae.pretrained.check_config; `origin(section)`: the folder a relative <section>.path
    resolves against)."""
    from circuitflow.sae.pretrained import check_config

    check_config(config, d_model, origin)
