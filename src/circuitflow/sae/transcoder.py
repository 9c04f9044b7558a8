"""Transcoders (`sae.kind: transcoder`): dictionaries that read an MLP's input and predict its
output, so each MLP can be replaced by sparse features (circuit-tracer's replacement model).

Training is the SAEs' own (sae/stage.py: SAELens's trainer or the fast TopK one, checkpoints,
resume, L0 control) with one change of data: a batch row is one token's [mlp_in | mlp_out], read
from the two activation files capture wrote in one forward pass, in one shuffled order
(`sae.data.PairedActivationStream`). `as_training_transcoder` makes SAELens's training SAE
compare its output with the mlp_out half (SAELens's trainer), and sae.fast does the same through
`split`.
SAELens's training SAEs already have a transcoder's shapes: an MLP reads and writes d_model, so
d_in == d_out; the decoder bias is not subtracted from the input (it lives in the output space).

Saved in SAELens's format as a transcoder (cfg.json `architecture`, `d_out`, metadata
`hook_name` = the MLP's input hook and `hook_name_out` = its output hook, SAELens's own keys),
as the architecture's registry entry says (`Architecture.transcoder` in sae/architectures.py):
standard -> `sae_lens.Transcoder` (ReLU); jumprelu and batchtopk -> `sae_lens.JumpReLUTranscoder`
(BatchTopK's learned threshold, as SAELens saves BatchTopK SAEs as JumpReLU); topk ->
`TopKTranscoder` below. SAELens has no TopK transcoder: ours subclasses `sae_lens.Transcoder` and
is registered in SAELens's own registry (`register_sae_class`), so `SAE.load_from_disk` returns
it once this module is imported (sae/files.py, every stage's loader, imports it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from sae_lens import Transcoder, TranscoderConfig, register_sae_class
from sae_lens.saes.sae import TrainStepInput, TrainStepOutput
from safetensors.torch import save_file


# --- the TopK transcoder SAELens lacks ------------------------------------------------------------
@dataclass
class TopKTranscoderConfig(TranscoderConfig):
    k: int = 100

    @classmethod
    def architecture(cls) -> str:
        return "topk_transcoder"


class TopKTranscoder(Transcoder):
    """A transcoder whose activation keeps each token's k largest ReLU'd pre-activations
    (SAELens's TopK, decoder norms folded into the encoder when saved)."""

    cfg: TopKTranscoderConfig  # type: ignore[assignment]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        hidden_pre = self.hook_sae_acts_pre(self.process_sae_in(x) @ self.W_enc + self.b_enc)
        values, indices = torch.topk(hidden_pre, self.cfg.k, dim=-1)
        acts = torch.zeros_like(hidden_pre).scatter(-1, indices, values.relu())
        return self.hook_sae_acts_post(acts)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> TopKTranscoder:
        return cls(TopKTranscoderConfig.from_dict(config_dict))


register_sae_class("topk_transcoder", TopKTranscoder, TopKTranscoderConfig)


def is_transcoder(sae: Any) -> bool:
    """Whether `sae` (inference or training) maps one hook to another."""
    return isinstance(sae, Transcoder) or getattr(sae, "is_training_transcoder", False)


def hook_out(sae: Any) -> str:
    """The hook a transcoder writes (its input hook is metadata.hook_name)."""
    return sae.cfg.metadata.hook_name_out


def skip_weight(tc: Any) -> torch.Tensor | None:
    """A skip transcoder's linear skip path W_skip [d_out, d_in] (SAELens's SkipTranscoder and
    JumpReLUSkipTranscoder: Gemma Scope 2's affine transcoders), else None."""
    return getattr(tc, "W_skip", None)


def transcoder_output(tc: Any, x: torch.Tensor, feats: torch.Tensor | None = None) -> torch.Tensor:
    """What transcoder `tc` writes for input `x`: its decoder's output of the features (`feats`,
    else encoded from x), plus the skip path x W_skip^T of a skip transcoder (SAELens's
    SkipTranscoder.forward; its decode leaves the skip out)."""
    out = tc.decode(tc.encode(x.to(tc.dtype)) if feats is None else feats)
    skip = skip_weight(tc)
    return out if skip is None else out + x.to(skip.dtype) @ skip.T


# --- training ---------------------------------------------------------------------------------
def split(sae: Any, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) of a training batch: [mlp_in | mlp_out] for a transcoder, the batch
    twice for an SAE."""
    if not getattr(sae, "is_training_transcoder", False):
        return batch, batch
    d_in = sae.cfg.d_in
    return batch[:, :d_in], batch[:, d_in:]


def _transcoder_forward_pass(sae: Any, step_input: TrainStepInput) -> TrainStepOutput:
    """SAELens's TrainingSAE.training_forward_pass with the target split off the input: the
    MSE (and TopK's auxiliary loss on dead latents) compare the output with mlp_out."""
    x, target = split(sae, step_input.sae_in)
    feature_acts, hidden_pre = sae.encode_with_hidden_pre(x)
    sae_out = sae.decode(feature_acts)
    mse = sae.mse_loss_fn(sae_out, target).sum(dim=-1).mean()
    aux = sae.calculate_aux_loss(
        step_input=TrainStepInput(
            sae_in=target,
            coefficients=step_input.coefficients,
            dead_neuron_mask=step_input.dead_neuron_mask,
            n_training_steps=step_input.n_training_steps,
            is_logging_step=step_input.is_logging_step,
        ),
        feature_acts=feature_acts,
        hidden_pre=hidden_pre,
        sae_out=sae_out,
    )
    aux = aux if isinstance(aux, dict) else {"auxiliary_loss": aux}
    return TrainStepOutput(
        sae_in=target,  # what SAELens's logging compares sae_out with
        sae_out=sae_out,
        feature_acts=feature_acts,
        hidden_pre=hidden_pre,
        loss=mse + sum(aux.values()),
        losses={"mse_loss": mse, **aux},
    )


def as_training_transcoder(sae: Any, hook_in: str, hook_out_name: str, saved_as: str) -> Any:
    """SAELens's training SAE `sae` (built with apply_b_dec_to_input false) trained as a
    transcoder from `hook_in` to `hook_out_name`, saved as SAELens's architecture `saved_as`
    (its registry entry's `transcoder`: the caller reads the registry, so this module does not
    import it)."""
    if sae.cfg.apply_b_dec_to_input:
        raise ValueError("a transcoder's decoder bias is in the output space: build it with "
                         "apply_b_dec_to_input false")  # fmt: skip
    sae.is_training_transcoder = True
    sae.saved_as = saved_as
    sae.cfg.metadata.hook_name = hook_in
    sae.cfg.metadata.hook_name_out = hook_out_name
    # An instance attribute, as sae.fast's compile option sets it: the class stays SAELens's.
    sae.training_forward_pass = partial(_transcoder_forward_pass, sae)
    return sae


@torch.no_grad()
def save_transcoder(sae: Any, path: Path | str) -> None:
    """Write training transcoder `sae` to `path` in SAELens's format (see the module's doc)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in sae.state_dict().items()}
    # SAELens's own processing: TopK's decoder norms folded into the encoder (selection and
    # output unchanged, decoder rows of unit norm), BatchTopK's threshold added.
    sae.process_state_dict_for_saving_inference(state)
    state.pop("topk_threshold", None)
    cfg = sae.cfg.get_inference_sae_cfg_dict()
    cfg.pop("rescale_acts_by_decoder_norm", None)  # a no-op on unit-norm rows
    cfg.update(
        architecture=sae.saved_as,
        d_out=int(state["W_dec"].shape[1]),
        apply_b_dec_to_input=False,
    )
    save_file(state, path / "sae_weights.safetensors")
    (path / "cfg.json").write_text(json.dumps(cfg))


def save_dictionary(sae: Any, path: Path | str) -> None:
    """A trained dictionary in SAELens's format: a transcoder as save_transcoder writes it, an
    SAE as SAELens's save_inference_model does."""
    if is_transcoder(sae):
        save_transcoder(sae, path)
    else:
        sae.save_inference_model(path)
