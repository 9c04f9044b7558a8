"""Previous-token and induction scores of every head from attention patterns alone: the ground
truth the science tests check attribution and interventions against, independent of both."""

from __future__ import annotations

import pandas as pd
import torch


def attention_scores(model, prompts: pd.DataFrame, seg: int = 10, n: int = 64):
    """Per head [layer, head]: previous-token score (attention to position q-1) and induction
    score (attention from a repeated token to the token after its previous occurrence), on
    random token sequences repeated twice; 0 for heads that write nothing. Independent of the
    attribution code."""
    bos = int(prompts["clean_tokens"].iloc[0][0])
    vocab = sorted({int(t) for ts in prompts["clean_tokens"] for t in ts[1:]})
    g = torch.Generator().manual_seed(0)
    seq = torch.tensor(vocab)[torch.randint(len(vocab), (n, seg), generator=g)]
    tokens = torch.cat([torch.full((n, 1), bos), seq, seq], dim=1)
    _, cache = model.run_with_cache(tokens)
    prev, ind = [], []
    q_all = torch.arange(2, tokens.shape[1])
    q_rep = torch.arange(seg + 1, tokens.shape[1])
    for layer in range(model.cfg.n_layers):
        pat = cache[f"blocks.{layer}.attn.hook_pattern"].mean(0)  # [head, query, key]
        # A pruned head (zero output weights) attends but writes nothing: it is no mechanism.
        live = model.blocks[layer].attn.W_O.flatten(1).norm(dim=1) > 0
        prev.append(pat[:, q_all, q_all - 1].mean(-1) * live)
        ind.append(pat[:, q_rep, q_rep - seg + 1].mean(-1) * live)
    return torch.stack(prev).detach().numpy(), torch.stack(ind).detach().numpy()
