"""Promoted and suppressed output tokens of each feature: its decoder direction read through the
unembedding, the direct effect of one unit of the feature on the logits.

Every dictionary here decodes into the residual stream's space (d_model): an SAE on
`resid_*`, `attn_out` or `mlp_out` reconstructs that activation, and a transcoder's decoder
writes the MLP's output, which the block adds to the residual stream as it is. So the same read
holds for both: the direction travels, unchanged by later layers on the direct path, to the
final norm and the unembedding.

**The final norm.** For a model whose final norm is LayerNorm (`LN`, or `LNPre` once
TransformerLens has folded it), the norm subtracts the mean over d_model, so the direction is
centred first (as TransformerLens's `center_writing_weights` makes every write); RMSNorm
(`RMS`, `RMSPre`) does not centre. An unfolded norm's elementwise scale (`ln_final.w`) is folded
into W_U, as `fold_ln` does; a folded model has it in W_U already. The division by the
residual's norm is a positive factor per token that does not depend on the feature, so it is
left out: the values are the logit effect per unit activation on a residual of unit scale,
comparable within a model, and their order is exact. The norm's bias and `b_U` add the same to
every feature and are left out. Last, each feature's logit effects are centred over the
vocabulary (softmax ignores a constant), as TransformerLens's `center_unembed` centres W_U, so
the numbers do not depend on how the model was loaded.

`logit_effects(W_dec, model)` gives [F, d_vocab]; `top_logits` its top and bottom k, computed a
block of features at a time so [F, d_vocab] is never held at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["LOGIT_HIST_BINS", "Logits", "decoder", "logit_effects", "top_logits", "unembed"]

LOGIT_HIST_BINS = 40


def decoder(dictionary: Any) -> torch.Tensor:
    """W_dec [d_sae, d_model] of a SAELens SAE or transcoder (or a tensor given as it is)."""
    w = dictionary if isinstance(dictionary, torch.Tensor) else dictionary.W_dec
    return w.detach().float()


def unembed(model: Any) -> tuple[torch.Tensor, bool]:
    """(W_U with the final norm's scale folded in [d_model, d_vocab], whether to centre the
    direction over d_model) of a TransformerLens HookedTransformer."""
    w_u = model.W_U.detach().float()
    norm = getattr(model.cfg, "normalization_type", None)
    ln_final = getattr(model, "ln_final", None)
    scale = getattr(ln_final, "w", None)
    if norm in ("LN", "RMS") and scale is not None:
        w_u = scale.detach().float()[:, None] * w_u
    return w_u, norm in ("LN", "LNPre")


def logit_effects(w_dec: torch.Tensor, w_u: torch.Tensor, centre: bool) -> torch.Tensor:
    """[F, d_vocab]: each decoder row, centred over d_model if `centre`, through `w_u`, then
    centred over the vocabulary."""
    d = w_dec - w_dec.mean(1, keepdim=True) if centre else w_dec
    out = d.to(w_u.device) @ w_u
    return out - out.mean(1, keepdim=True)


@dataclass
class Logits:
    """Per feature the k most promoted and most suppressed tokens ([F, k], descending and
    ascending) and a histogram of its effects on the whole vocabulary (`LOGIT_HIST_BINS`
    equal bins from its minimum to its maximum: `hist_lo`, `hist_hi` [F], `hist` [F, bins])."""

    top_ids: np.ndarray
    top_values: np.ndarray
    bottom_ids: np.ndarray
    bottom_values: np.ndarray
    hist_lo: np.ndarray
    hist_hi: np.ndarray
    hist: np.ndarray


@torch.no_grad()
def top_logits(dictionary: Any, model: Any, k: int = 10, block: int = 1024) -> Logits:
    """The promoted and suppressed tokens of every feature of `dictionary` (a SAELens SAE or
    transcoder, or W_dec) read through `model` (a TransformerLens HookedTransformer)."""
    w_dec = decoder(dictionary)
    w_u, centre = unembed(model)
    k = min(k, w_u.shape[1])
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in Logits.__dataclass_fields__}
    for s in range(0, len(w_dec), block):
        eff = logit_effects(w_dec[s : s + block], w_u, centre)
        top = eff.topk(k, dim=1)
        bot = eff.topk(k, dim=1, largest=False)
        lo, hi = eff.amin(1), eff.amax(1)
        width = (hi - lo).clamp(min=1e-12)
        b = ((eff - lo[:, None]) / width[:, None] * LOGIT_HIST_BINS).long()
        b = b.clamp(0, LOGIT_HIST_BINS - 1) + LOGIT_HIST_BINS * torch.arange(len(eff))[:, None]
        hist = torch.bincount(b.flatten(), minlength=len(eff) * LOGIT_HIST_BINS)
        for name, t in (
            ("top_ids", top.indices),
            ("top_values", top.values),
            ("bottom_ids", bot.indices),
            ("bottom_values", bot.values),
            ("hist_lo", lo),
            ("hist_hi", hi),
            ("hist", hist.view(len(eff), LOGIT_HIST_BINS)),
        ):
            parts[name].append(t.cpu())
    return Logits(**{n: torch.cat(v).numpy() for n, v in parts.items()})
