"""Token windows, with every token's activation, around the contexts the collector kept.

The collector keeps (feature, context, position) only; the windows are materialised here, for
the survivors alone, by reading their contexts again: `read(contexts)` returns the tokens
[n, T] and the dictionary's activations [n, T, F] of those contexts of the token set (for the
pipeline: the model and the dictionary run on them; in tests: an array). Each context is read
once, however many features kept it, `chunk` contexts at a time, so the extra work is at most
one pass over the distinct contexts kept (never more than the contexts fed, usually far fewer)
and the memory one chunk's activations.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["read_windows"]

Reader = Callable[[np.ndarray], tuple[np.ndarray | torch.Tensor, torch.Tensor]]


@torch.no_grad()
def read_windows(
    feature: np.ndarray,
    context: np.ndarray,
    position: np.ndarray,
    read: Reader,
    left: int = 12,
    right: int = 4,
    chunk: int = 64,
    first_position: int = 0,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """Windows [position - left, position + right] (cut at the context's ends and before
    `first_position`) of each entry (feature, context, position).

    Returns per entry the window's tokens (int64) and activations (float32), the window's first
    position in its context, and the entry's index inside its window."""
    n = len(feature)
    tokens: list[np.ndarray] = [np.empty(0, np.int64)] * n
    values: list[np.ndarray] = [np.empty(0, np.float32)] * n
    start = np.zeros(n, dtype=np.int64)
    offsets = np.arange(-left, right + 1)
    order = np.argsort(context, kind="stable")
    unique = np.unique(context[order])
    for c0 in range(0, len(unique), chunk):
        ctxs = unique[c0 : c0 + chunk]
        toks, acts = read(ctxs)
        toks = torch.as_tensor(toks).long()
        acts = torch.as_tensor(acts).float()
        t = toks.shape[1]
        rows = order[np.isin(context[order], ctxs)]
        local = np.searchsorted(ctxs, context[rows])
        where = position[rows, None] + offsets[None, :]
        valid = (where >= first_position) & (where < t)
        clip = np.clip(where, 0, t - 1)
        win_tok = toks[local[:, None], clip].numpy()
        win_act = acts[local[:, None], clip, feature[rows, None]].numpy()
        for j, row in enumerate(rows):
            tokens[row] = win_tok[j][valid[j]]
            values[row] = win_act[j][valid[j]]
            start[row] = where[j][valid[j]][0]
    return tokens, values, start, position - start
