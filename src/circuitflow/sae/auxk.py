"""The AuxK loss's size and scale (Gao et al. 2024, appendix B.1), shared by the per-layer
trainers (sae.fast) and the cross-layer one (sae.cross_layer_train). Its own module so that the
cross-layer trainer does not import SAELens (sae.fast does, ~13 s on a busy CPU) for one rule."""

from __future__ import annotations


def aux_size(d_in: int, n_dead: int) -> tuple[int, float]:
    """SAELens's AuxK size and scale: k_aux = d_in // 2 dead latents per token (Gao et al.,
    appendix B.1), the loss scaled down while fewer latents than that are dead."""
    k_aux = d_in // 2
    return min(k_aux, n_dead), min(n_dead / k_aux, 1.0)
