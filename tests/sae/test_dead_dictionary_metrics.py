"""A dead dictionary (no latent fires: one with a very negative b_enc, a JumpReLU one whose
threshold is above every pre-activation, a TopK one whose pre-activations are all <= 0) is
measured like any other: l0 0, dead_fraction 1.0, its losses numbers, and the job's line says
it is dead."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from circuitflow.sae.lifecycle import metrics_line
from circuitflow.sae.pretrained_stage import evaluate

VOCAB, D, T = 40, 32, 10


@pytest.fixture(scope="module")
def model():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=D, n_heads=4, d_head=8, d_mlp=64, d_vocab=VOCAB, n_ctx=T,
        act_fn="gelu", normalization_type="LN", seed=0, device="cpu",
    )  # fmt: skip
    return HookedTransformer(cfg).eval()


def dead_sae():
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post")
    sae = StandardSAE(StandardSAEConfig(d_in=D, d_sae=12, device="cpu", metadata=meta)).eval()
    with torch.no_grad():
        sae.b_enc.fill_(-1e4)
    return sae


def dead_jumprelu():
    from sae_lens import JumpReLUSAE, JumpReLUSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post")
    sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=D, d_sae=12, device="cpu", metadata=meta)).eval()
    with torch.no_grad():
        sae.W_enc.normal_(generator=torch.Generator().manual_seed(0))
        sae.threshold.fill_(1e4)  # above every pre-activation
    return sae


def dead_transcoder(model):
    from helpers.transcoders import random_transcoders

    tc = random_transcoders(model, d_sae=12, k=3)[0]
    with torch.no_grad():
        tc.b_enc.fill_(-1e4)  # TopK keeps 3 pre-activations, every one <= 0
    return tc


@pytest.mark.parametrize(("kind", "layer"), [("sae", 1), ("jumprelu", 1), ("transcoder", 0)])
def test_a_dead_dictionary_is_measured_and_says_so(model, kind, layer):
    build = {"sae": dead_sae, "jumprelu": dead_jumprelu}.get(kind)
    d = build() if build else dead_transcoder(model)
    contexts = torch.randint(1, VOCAB, (8, T), generator=torch.Generator().manual_seed(0))
    contexts[:, 0] = 0
    m = evaluate(model, d, SimpleNamespace(layer=layer), contexts, True, 0)
    assert m["l0"] == 0 and m["dead_fraction"] == 1.0
    assert all(isinstance(m[k], float) for k in ("ce_clean", "ce_sae", "ce_zero"))
    json.dumps(m, allow_nan=False)
    line = metrics_line({**m, "kind": kind})
    assert "dead dictionary" in line
