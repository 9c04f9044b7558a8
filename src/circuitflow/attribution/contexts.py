"""Top activating contexts of SAE features, from the capture stage's activation files.

The file's `tokens` are in context order, `context_length - bos_excluded` rows per context, so a
row index gives (context, position); the window around a maximum is decoded with the model's
tokenizer.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np
import pandas as pd
import torch


@torch.no_grad()
def top_activations(
    acts_path, sae, features: list[int], k: int, max_tokens: int, chunk: int = 16384
) -> tuple[np.ndarray, np.ndarray]:
    """Per feature, the k largest activations and their row indices ([n_feat, k] each), over the
    first `max_tokens` rows of the activation file, encoded in chunks (memory stays flat)."""
    idx = torch.tensor(features, dtype=torch.long)
    best_v = torch.full((len(features), k), -torch.inf)
    best_i = torch.full((len(features), k), -1, dtype=torch.long)
    with h5py.File(acts_path, "r") as f:
        n = min(int(f["acts"].shape[0]), max_tokens)
        for s in range(0, n, chunk):
            x = torch.from_numpy(f["acts"][s : min(s + chunk, n)].astype(np.float32))
            feats = sae.encode(x.to(sae.device, sae.dtype))[:, idx.to(sae.device)].float().cpu()
            rows = torch.arange(s, s + len(x)).expand(len(features), -1)
            v = torch.cat([best_v, feats.T], dim=1)
            i = torch.cat([best_i, rows], dim=1)
            top = v.topk(k, dim=1)
            best_v, best_i = top.values, i.gather(1, top.indices)
    return best_v.numpy(), best_i.numpy()


def contexts(
    acts_path,
    sae,
    site: str,
    layer: int,
    features: list[int],
    tokenizer: Any,
    n_contexts: int = 8,
    window: int = 8,
    max_tokens: int = 262144,
) -> pd.DataFrame:
    """One row per (feature, rank): activation, row, context, position, the window's token ids,
    its decoded text and the decoded max token."""
    if not features:
        return pd.DataFrame()
    values, rows = top_activations(acts_path, sae, features, n_contexts, max_tokens)
    with h5py.File(acts_path, "r") as f:
        per_ctx = int(f.attrs["context_length"]) - (1 if bool(f.attrs["bos_excluded"]) else 0)
        tokens = f["tokens"]
        out = []
        for fi, feat in enumerate(features):
            for rank, (v, r) in enumerate(zip(values[fi], rows[fi], strict=True)):
                if r < 0 or not np.isfinite(v) or v <= 0:
                    continue
                ctx, pos = divmod(int(r), per_ctx)
                lo = ctx * per_ctx + max(0, pos - window)
                hi = ctx * per_ctx + min(per_ctx, pos + 3)
                ids = tokens[lo:hi].astype(np.int64).tolist()
                mark = int(r) - lo
                out.append(
                    {
                        "site": site,
                        "layer": layer,
                        "feature": int(feat),
                        "rank": rank + 1,
                        "activation": float(v),
                        "row": int(r),
                        "context": ctx,
                        "position": pos,
                        "tokens": ids,
                        "max_token": _decode(tokenizer, [ids[mark]]),
                        "text": _decode(tokenizer, ids[:mark])
                        + " [["
                        + _decode(tokenizer, [ids[mark]])
                        + "]] "
                        + _decode(tokenizer, ids[mark + 1 :]),
                    }
                )
    return pd.DataFrame(out)


def _decode(tokenizer: Any, ids: list[int]) -> str:
    if tokenizer is None:
        return " ".join(map(str, ids))
    return tokenizer.decode(ids).strip()
