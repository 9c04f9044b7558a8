"""The `sae:` config section as typed dataclasses (defaults: the schema's, checked by tests/sae)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from circuitflow.errors import ConfigError
from circuitflow.sae import architectures
from circuitflow.sae.sparsity import SparsityControllerConfig


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

    init_threshold: float = 0.01
    bandwidth: float = 0.05
    sparsity_loss_mode: Literal["step", "tanh", "quadratic"] = "quadratic"
    pre_act_loss_coefficient: float | None = 1e-3
    tanh_scale: float = 4.0
    ste_to_input: bool = False
    # Steps without firing before a latent counts as dead for the pre-activation loss;
    # null means the trainer's dead window (sae.dead_window_tokens / sae.batch_size).
    dead_window_steps: int | None = 20


TRAINERS = ("auto", "fast", "saelens")


@dataclass
class SAETrainConfig:
    """The ``sae:`` config block (schema: workflow/schemas, key ``sae``)."""

    architecture: str = "topk"  # a key of sae.architectures.ARCHITECTURES
    expansion_factor: int = 8
    d_sae: int | None = None
    k: int = 16
    target_l0: float = 16.0
    l1_coefficient: float = 0.05
    controller: SparsityControllerConfig = field(default_factory=SparsityControllerConfig)
    jumprelu: JumpReLUConfig = field(default_factory=JumpReLUConfig)
    lr: float = 4e-3
    lr_warm_up_steps: int = 10
    lr_decay_fraction: float = 0.2
    total_tokens: int = 1_000_000
    batch_size: int | Literal["auto"] = 1024  # auto: planned from the device's memory
    normalize_activations: Literal["none", "expected_average_only_in"] = "expected_average_only_in"
    shuffle_buffer_tokens: int = 262_144
    checkpoint_every_tokens: int = 250_000
    dead_window_tokens: int = 200_000
    eval_contexts: int = 64
    # auto: the fast sparse trainer (sae.fast) where the architecture has one, else SAELens's.
    trainer: Literal["auto", "fast", "saelens"] = "auto"
    autocast: bool = False
    compile: bool = False
    device: str = "auto"
    seed: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SAETrainConfig:
        """From the pipeline's config: the `sae` section with the master `seed` and `device`."""
        return cls.from_dict(
            {**config["sae"], "device": config.get("device", "auto"), "seed": config.get("seed", 0)}
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SAETrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"sae: unknown key(s) {unknown}")
        d = dict(d)
        ctrl = d.pop("controller", None) or {}
        cnames = {f.name for f in dataclasses.fields(SparsityControllerConfig)}
        bad = sorted(set(ctrl) - cnames)
        if bad:
            raise ConfigError(f"sae.controller: unknown key(s) {bad}")
        jr = d.pop("jumprelu", None) or {}
        jnames = {f.name for f in dataclasses.fields(JumpReLUConfig)}
        bad = sorted(set(jr) - jnames)
        if bad:
            raise ConfigError(f"sae.jumprelu: unknown key(s) {bad}")
        cfg = cls(**d, controller=SparsityControllerConfig(**ctrl), jumprelu=JumpReLUConfig(**jr))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        architectures.get(self.architecture)  # ConfigError naming the allowed values
        positive = (
            "expansion_factor",
            "k",
            "target_l0",
            "lr",
            "total_tokens",
            "batch_size",
            "checkpoint_every_tokens",
            "dead_window_tokens",
            "eval_contexts",
        )
        if self.batch_size != "auto" and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
        ):
            raise ConfigError(
                f"sae.batch_size: must be a positive integer or 'auto', got {self.batch_size!r}"
            )
        for key in positive:
            if key == "batch_size" and self.batch_size == "auto":
                continue
            if not getattr(self, key) > 0:
                raise ConfigError(f"sae.{key}: must be positive, got {getattr(self, key)!r}")
        if self.batch_size != "auto" and self.total_tokens < self.batch_size:
            raise ConfigError("sae.total_tokens: must be at least sae.batch_size")
        if not 0 <= self.lr_decay_fraction < 1:
            raise ConfigError("sae.lr_decay_fraction: must be in [0, 1)")
        if self.trainer not in TRAINERS:
            raise ConfigError(
                f"sae.trainer: {self.trainer!r}; allowed values: {', '.join(TRAINERS)}"
            )
        if self.trainer == "fast" and not architectures.get(self.architecture).sparse_trainer:
            fast = [k for k, a in architectures.ARCHITECTURES.items() if a.sparse_trainer]
            raise ConfigError(
                f"sae.trainer: fast trains {', '.join(fast)} only, not {self.architecture}; "
                "use auto or saelens"
            )

    def uses_fast_trainer(self) -> bool:
        """Whether sae.fast's sparse trainer trains this SAE (else SAELens's trainer)."""
        if self.trainer == "auto":
            return architectures.get(self.architecture).sparse_trainer
        return self.trainer == "fast"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
