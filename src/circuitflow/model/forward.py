"""Running a TransformerLens model for its last position's logits alone.

Interventions score only the last position, and at a real vocabulary the unembedding is a third of
a forward pass (GPT-2 small: 38.6M of its 124M matmul weights) at every position. Running the
blocks with `stop_at_layer` and unembedding the last position gives the same logits there: the
final LayerNorm and the unembedding act position by position. The steps mirror
HookedTransformer.forward's own tail (final norm, unembed, soft cap); hooks on the blocks fire as
in a full forward.
"""

from __future__ import annotations

import torch


def last_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """The model's logits at the last position of `tokens` [batch, pos]: [batch, d_vocab]."""
    from transformer_lens.utilities.activation_functions import apply_softcap  # 9 s to import

    resid = model(tokens, stop_at_layer=model.cfg.n_layers)[:, -1:]
    if model.cfg.normalization_type is not None:
        resid = model.ln_final(resid)
    logits = apply_softcap(model.unembed(resid), model.cfg.output_logits_soft_cap)
    return logits[:, 0]
