"""Top activating contexts of SAE features, from the rows an SAE reads: the capture stage's
activation file (`FileRows`), or, where no file was written (`sae.source: stream` or
`pretrained`), the model run over the run's token set (`TokenSetRows`), which yields the same
rows in the same order.

Rows are in context order, `context_length - bos_excluded` rows per context, so a row index
gives (context, position); the window around a maximum is decoded with the model's tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
import pandas as pd
import torch


class FileRows:
    """The rows of a capture-stage activation file (`acts`, `tokens`)."""

    def __init__(self, path):
        self.path = path
        with h5py.File(path, "r") as f:
            self.n_rows = int(f["acts"].shape[0])
            self.per_context = int(f.attrs["context_length"]) - int(bool(f.attrs["bos_excluded"]))

    def acts(self, start: int, stop: int) -> torch.Tensor:
        with h5py.File(self.path, "r") as f:
            return torch.from_numpy(f["acts"][start:stop].astype(np.float32))

    def tokens(self, start: int, stop: int) -> np.ndarray:
        with h5py.File(self.path, "r") as f:
            return f["tokens"][start:stop].astype(np.int64)


@dataclass
class TokenSetRows:
    """The rows an activation file of `hook` would hold for the token set `contexts`
    ([n_contexts, context_length], BOS first): the model run to the hook's layer
    (stop_at_layer) a few contexts at a time, BOS left out when `bos_excluded`, as capture
    stores them. Contexts already run are kept until the next chunk asks for others."""

    model: Any
    hook: str
    contexts: np.ndarray
    bos_excluded: bool = True
    batch_contexts: int = 16
    _cached: tuple[int, torch.Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.per_context = self.contexts.shape[1] - int(self.bos_excluded)
        self.n_rows = len(self.contexts) * self.per_context

    @torch.no_grad()
    def _run(self, first: int) -> torch.Tensor:
        """Rows of contexts [first, first + batch_contexts), float32 on the CPU."""
        from circuitflow.nodes import site_layer

        _, layer = site_layer(self.hook)
        ids = torch.from_numpy(
            np.asarray(self.contexts[first : first + self.batch_contexts], dtype=np.int64)
        ).to(next(self.model.parameters()).device)
        _, cache = self.model.run_with_cache(ids, names_filter=[self.hook], stop_at_layer=layer + 1)
        acts = cache[self.hook][:, int(self.bos_excluded) :].float().cpu()
        return acts.reshape(-1, acts.shape[-1])

    def acts(self, start: int, stop: int) -> torch.Tensor:
        out = []
        while start < stop:
            ctx = start // self.per_context
            first = ctx - ctx % self.batch_contexts
            if self._cached is None or self._cached[0] != first:
                self._cached = (first, self._run(first))
            base = first * self.per_context
            rows = self._cached[1]
            take = min(stop, base + len(rows)) - start
            out.append(rows[start - base : start - base + take])
            start += take
        return torch.cat(out)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        body = np.asarray(self.contexts[:, int(self.bos_excluded) :], dtype=np.int64)
        return body.reshape(-1)[start:stop]


@torch.no_grad()
def top_activations(
    rows, sae, features: list[int], k: int, max_tokens: int, chunk: int = 16384
) -> tuple[np.ndarray, np.ndarray]:
    """Per feature, the k largest activations and their row indices ([n_feat, k] each), over the
    first `max_tokens` rows (FileRows or TokenSetRows), encoded in chunks (memory stays flat)."""
    idx = torch.tensor(features, dtype=torch.long)
    best_v = torch.full((len(features), k), -torch.inf)
    best_i = torch.full((len(features), k), -1, dtype=torch.long)
    n = min(rows.n_rows, max_tokens)
    for s in range(0, n, chunk):
        x = rows.acts(s, min(s + chunk, n))
        feats = sae.encode(x.to(sae.device, sae.dtype))[:, idx.to(sae.device)].float().cpu()
        positions = torch.arange(s, s + len(x)).expand(len(features), -1)
        v = torch.cat([best_v, feats.T], dim=1)
        i = torch.cat([best_i, positions], dim=1)
        top = v.topk(k, dim=1)
        best_v, best_i = top.values, i.gather(1, top.indices)
    return best_v.numpy(), best_i.numpy()


def contexts(
    rows,
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
    its decoded text and the decoded max token. `rows`: FileRows or TokenSetRows."""
    if not features:
        return pd.DataFrame()
    values, found = top_activations(rows, sae, features, n_contexts, max_tokens)
    per_ctx = rows.per_context
    out = []
    for fi, feat in enumerate(features):
        for rank, (v, r) in enumerate(zip(values[fi], found[fi], strict=True)):
            if r < 0 or not np.isfinite(v) or v <= 0:
                continue
            ctx, pos = divmod(int(r), per_ctx)
            lo = ctx * per_ctx + max(0, pos - window)
            hi = ctx * per_ctx + min(per_ctx, pos + 3)
            ids = rows.tokens(lo, hi).tolist()
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
