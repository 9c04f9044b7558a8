"""FLOPs of a model by its architecture: one token through its blocks and unembedding, and one
prompt's forward pass with dictionaries spliced in. Counts are matrix-multiply FLOPs (2 per
multiply-add), as in `circuitflow.perf`, which holds what knows no model (an SAE's FLOPs, `Work`,
the devices' peak rates, `PassCounter`)."""

from __future__ import annotations

from circuitflow.model.architectures import matmul_params_per_layer
from circuitflow.perf import spliced_sae_flops_per_token


def forward_flops_per_token(
    cfg, context_length: int, n_layers: int | None = None, unembed: bool = True
) -> float:
    """FLOPs of one token through `n_layers` blocks (default: all) and the unembedding.

    Per block: the projections and MLP (2 x their weights), and attention's two [t, t]
    products per head over the full context (TransformerLens computes the whole square and
    masks it afterwards).
    """
    layers = cfg.n_layers if n_layers is None else n_layers
    per_layer = 2 * matmul_params_per_layer(cfg) + 4 * cfg.n_heads * cfg.d_head * context_length
    return float(layers * per_layer + (2 * cfg.d_model * cfg.d_vocab if unembed else 0))


def attribution_forward_flops_per_prompt(
    model_cfg, prompt_length: int, n_saes: int, d_sae: int
) -> float:
    """FLOPs of one forward pass of a prompt with every SAE spliced in."""
    per_token = forward_flops_per_token(model_cfg, prompt_length) + n_saes * (
        spliced_sae_flops_per_token(model_cfg.d_model, d_sae)
    )
    return per_token * prompt_length
