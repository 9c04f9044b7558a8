"""A tiny random TransformerLens model with a random SAE on every layer's resid_post, and random
prompt pairs: the fixture of the attribution and interventions unit tests."""

from __future__ import annotations

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


def write_feature_dirs(model, saes: dict, out_dir, n_contexts: int = 48, seed: int = 1) -> list:
    """The features stage's folder (features/{site}/layer_{layer}) of every SAE in `saes`, from
    random contexts (BOS token 0 first, left out): what the attribution stage reads each
    feature's label and top contexts from."""
    from circuitflow.features import logits, write
    from circuitflow.features.collect import Collector
    from circuitflow.nodes import site_layer

    tokens = torch.from_numpy(np.random.default_rng(seed).integers(1, VOCAB, (n_contexts, SEQ)))
    tokens[:, 0] = 0
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=list(saes))
    folders = []
    for hook, sae in saes.items():
        site, layer = site_layer(hook)
        with torch.no_grad():
            acts = sae.encode(cache[hook]).float()

        def read(ids, acts=acts):
            ids = torch.as_tensor(np.asarray(ids))
            return tokens[ids], acts[ids]

        col = Collector(sae.cfg.d_sae, k=8, samples=2, first_position=1)
        col.update(tokens, acts)
        feats, ctx, summary = write.build(
            col.result(), logits.top_logits(sae, model, k=5), read,
            [str(i) for i in range(VOCAB)], first_position=1,
            meta={"site": site, "layer": layer, "hook": hook},
        )  # fmt: skip
        folders.append(write.write(write.feature_dir(out_dir, site, layer), feats, ctx, summary))
    return folders
