"""forward.last_logits against TransformerLens's full forward, on both real architectures' kinds
(LayerNorm and learned positions; RMSNorm, rotary and a gated MLP) at reduced sizes."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer

from circuitflow.model import architectures
from circuitflow.model.forward import last_logits

SMALL = dict(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=128, d_vocab=500, n_ctx=64)


@pytest.mark.parametrize("name", ["gpt2-small", "qwen2.5-0.5b"])
def test_last_logits_equal_the_full_forward_at_the_last_position(name):
    gqa = {"n_key_value_heads": 2, "rotary_dim": 16}
    overrides = SMALL | (gqa if name == "qwen2.5-0.5b" else {})
    model = HookedTransformer(architectures.config(name, seed=0, **overrides)).eval()
    tokens = torch.randint(0, 500, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)[:, -1]
        last = last_logits(model, tokens)
    assert last.shape == full.shape
    torch.testing.assert_close(last, full, rtol=1e-5, atol=1e-5)
    # Blocks' hooks fire as in a full forward: an ablation there moves the logits.
    hook = ("blocks.1.hook_resid_post", lambda act, hook: act * 0)
    with torch.no_grad(), model.hooks(fwd_hooks=[hook]):
        torch.testing.assert_close(last_logits(model, tokens), model(tokens)[:, -1])
