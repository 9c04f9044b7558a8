"""A tiny random TransformerLens model with a random SAE on every layer's resid_post, and random
prompt pairs: the fixture of the attribution and interventions unit tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from circuitflow.nodes import hook_name

N_LAYERS, N_HEADS, D_MODEL, D_SAE, VOCAB, SEQ = 2, 2, 16, 32, 20, 6


def tiny_spliced(n_prompts: int, frozen: bool = False):
    """(model, {hook: SAE}, prompts). `frozen`: no parameter requires a gradient."""
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    cfg = HookedTransformerConfig(
        n_layers=N_LAYERS,
        d_model=D_MODEL,
        n_heads=N_HEADS,
        d_head=D_MODEL // N_HEADS,
        d_mlp=32,
        d_vocab=VOCAB,
        n_ctx=SEQ,
        act_fn="gelu",
        normalization_type="LN",
    )
    model = HookedTransformer(cfg).eval()
    saes = {}
    for layer in range(N_LAYERS):
        hook = hook_name("resid_post", layer)
        sae_cfg = StandardSAEConfig(
            d_in=D_MODEL, d_sae=D_SAE, metadata=SAEMetadata(hook_name=hook), device="cpu"
        )
        sae = StandardSAE(sae_cfg).eval()
        with torch.no_grad():  # encoder = decoder.T so features actually fire
            sae.W_enc.copy_(sae.W_dec.T)
        saes[hook] = sae
    if frozen:
        for module in (model, *saes.values()):
            for p in module.parameters():
                p.requires_grad_(False)
    rng = np.random.default_rng(0)
    clean = rng.integers(0, VOCAB, size=(n_prompts, SEQ))
    corrupted = clean.copy()
    corrupted[:, :3] = rng.integers(0, VOCAB, size=(n_prompts, 3))
    prompts = pd.DataFrame(
        {
            "prompt_id": range(n_prompts),
            "clean_tokens": list(clean),
            "corrupted_tokens": list(corrupted),
            "answer_id": rng.integers(0, VOCAB, n_prompts),
            "distractor_id": rng.integers(0, VOCAB, n_prompts),
        }
    )
    return model, saes, prompts


def write_activations(model, out_dir, n_contexts: int = 48, seed: int = 1) -> dict:
    """{hook: activation file} of every resid_post on random contexts (BOS token 0 first, then
    excluded), in the capture stage's format: what the attribution stage reads for contexts."""
    from circuitflow.capture.files import write_activation_file

    tokens = torch.from_numpy(np.random.default_rng(seed).integers(1, VOCAB, (n_contexts, SEQ)))
    tokens[:, 0] = 0
    hooks = [hook_name("resid_post", layer) for layer in range(N_LAYERS)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=hooks)
    files = {}
    for layer, hook in enumerate(hooks):
        path = Path(out_dir) / f"layer_{layer}.h5"
        acts = cache[hook][:, 1:].reshape(-1, D_MODEL).numpy().astype(np.float32)
        attrs = {"hook_name": hook, "layer": layer, "site": "resid_post", "model_hash": "m0",
                 "token_set_hash": "t0", "context_length": SEQ, "bos_excluded": True,
                 "bos_token_id": 0}  # fmt: skip
        write_activation_file(path, acts, tokens[:, 1:].reshape(-1).numpy(), attrs)
        files[hook] = path
    return files
