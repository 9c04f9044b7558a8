"""The SAE architectures the train_sae stage can train: one registry entry each.

An entry says how to build SAELens's training SAE from the `sae:` config, which sparsity
coefficient (if any) the PI controller steers, how much memory a training row needs, which
SAELens architecture a transcoder of it is saved as (sae.kind transcoder or both), and whether
the fast sparse trainer (sae.fast) can train it.
Adding an architecture is one entry here and one value in the schema's `sae.architecture` enum
(tests/sae check that the two agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Architecture:
    # (sae config, SAELens config fields every architecture shares) -> TrainingSAE
    build: Callable[[Any, dict[str, Any]], Any]
    # SAELens's name of the sparsity coefficient the controller steers; None where k fixes L0.
    controlled_coefficient: str | None
    # d_sae-wide fp32 tensors per training row alive at the step's peak (the backward pass),
    # counted for SAELens 6.54's training forward, losses (TopK's auxiliary loss on dead latents
    # included), backward and the trainer's firing statistics, on CPU by tests/memory.
    wide_per_row: float
    # SAELens's architecture name (cfg.json `architecture`, a class in SAELens's registry) a
    # transcoder of this architecture is saved and loaded as (sae/transcoder.py).
    transcoder: str
    # The same for sae.fast's sparse trainer: its dense pre-activations and scores, topk's and
    # BatchTopK's temporaries, the AuxK candidates (most latents dead) and the selected entries
    # at d_sae = 32 d_in, measured by tests/helpers/memory_probe.py. None where that trainer
    # cannot train the architecture.
    sparse_wide_per_row: float | None = None
    # The same for sae.stacked's gpu trainer, per member of its stack (float32 products: its
    # pre-activations, scores, the dense selections A and AuxK's, their gradient products),
    # measured by tests/helpers/memory_probe.py. None where it cannot train the architecture.
    gpu_wide_per_row: float | None = None

    @property
    def sparse_trainer(self) -> bool:
        """Whether the trainers of TopK-like SAEs (sae.fast's, sae.stacked's) can train it."""
        return self.sparse_wide_per_row is not None

    def wide(self, trainer: str) -> float:
        """d_sae-wide float32 tensors per training row for `trainer` (fast, gpu, saelens)."""
        wide = {"fast": self.sparse_wide_per_row, "gpu": self.gpu_wide_per_row}.get(
            trainer, self.wide_per_row
        )
        if wide is None:
            raise ValueError(f"sae.trainer {trainer} cannot train this architecture")
        return wide


def _topk(cfg, common):
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

    return TopKTrainingSAE(TopKTrainingSAEConfig(k=cfg.k, **common))


def _batchtopk(cfg, common):
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig

    return BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(k=cfg.k, **common))


def _jumprelu(cfg, common):
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig

    jr = cfg.jumprelu
    return JumpReLUTrainingSAE(
        JumpReLUTrainingSAEConfig(
            l0_coefficient=cfg.l1_coefficient,
            jumprelu_init_threshold=jr.init_threshold,
            jumprelu_bandwidth=jr.bandwidth,
            jumprelu_sparsity_loss_mode=jr.sparsity_loss_mode,
            pre_act_loss_coefficient=jr.pre_act_loss_coefficient,
            jumprelu_tanh_scale=jr.tanh_scale,
            jumprelu_ste_to_input=jr.ste_to_input,
            target_l0=cfg.target_l0 if jr.sparsity_loss_mode == "quadratic" else None,
            **common,
        )
    )


def _standard(cfg, common):
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig

    return StandardTrainingSAE(
        StandardTrainingSAEConfig(l1_coefficient=cfg.l1_coefficient, **common)
    )


ARCHITECTURES: dict[str, Architecture] = {
    # SAELens has no TopK transcoder: sae/transcoder.py registers ours. BatchTopK is saved with
    # its learned threshold, as SAELens saves BatchTopK SAEs as JumpReLU.
    "topk": Architecture(
        _topk, None, 11.0, "topk_transcoder", sparse_wide_per_row=3.1, gpu_wide_per_row=2.4
    ),
    # BatchTopK's topk over the whole [batch * d_sae] batch copies it on CPU (values, indices).
    "batchtopk": Architecture(
        _batchtopk,
        None,
        12.0,
        "jumprelu_transcoder",
        sparse_wide_per_row=6.8,
        gpu_wide_per_row=7.0,
    ),
    "jumprelu": Architecture(_jumprelu, "l0", 9.5, "jumprelu_transcoder"),
    "standard": Architecture(_standard, "l1", 8.5, "transcoder"),
}


def get(name: str) -> Architecture:
    from circuitflow.errors import ConfigError

    if name not in ARCHITECTURES:
        raise ConfigError(f"sae.architecture: {name!r}; allowed values: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def build_training_sae(cfg, d_in: int, hook_name: str, device: str, hook_name_out: str = ""):
    """SAELens's training SAE for `cfg` (the sae: section as SAETrainConfig); with
    `hook_name_out`, trained as a transcoder from `hook_name` to it (sae.transcoder)."""
    from sae_lens.saes.sae import SAEMetadata

    from circuitflow.sae.transcoder import as_training_transcoder

    common: dict[str, Any] = {
        "d_in": d_in,
        "d_sae": cfg.d_sae or cfg.expansion_factor * d_in,
        "device": device,
        "normalize_activations": cfg.normalize_activations,
        # Without hook_name, HookedSAETransformer.add_sae silently skips the SAE.
        "metadata": SAEMetadata(hook_name=hook_name),
    }
    if not hook_name_out:
        return get(cfg.architecture).build(cfg, common)
    # A transcoder's decoder bias lives in the output's space: nothing to centre the input by.
    sae = get(cfg.architecture).build(cfg, common | {"apply_b_dec_to_input": False})
    return as_training_transcoder(sae, hook_name, hook_name_out, get(cfg.architecture).transcoder)
