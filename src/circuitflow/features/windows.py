"""Token windows, with every token's activation, around the contexts the collector kept.

The collector keeps (feature, context, position) only; the windows are materialised here, for
the survivors alone, by reading their contexts again: `read(contexts)` returns the tokens
[n, T] and the dictionary's activations [n, T, F] of those contexts of the token set (for the
pipeline: the model and the dictionary run on them; in tests: an array). Each context is read
once, however many features kept it, `chunk` contexts at a time, so the extra work is at most
one pass over the distinct contexts kept (never more than the contexts fed, usually far fewer)
and the memory one chunk's activations.

`read_windows_many` does the same for several dictionaries that share a forward pass (the
features stage's group): one sweep over the union of their contexts, `read(contexts)` giving
the tokens and, per dictionary on demand, its activations, so the model runs once per context
for all of them rather than once per dictionary.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["read_windows"]

Reader = Callable[[np.ndarray], tuple[np.ndarray | torch.Tensor, torch.Tensor]]


Windows = tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]
ManyReader = Callable[[np.ndarray], tuple[np.ndarray | torch.Tensor, Callable[[int], torch.Tensor]]]


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
) -> Windows:
    """Windows [position - left, position + right] (cut at the context's ends and before
    `first_position`) of each entry (feature, context, position).

    Returns per entry the window's tokens (int64) and activations (float32), the window's first
    position in its context, and the entry's index inside its window."""

    def read_one(ids: np.ndarray):
        toks, acts = read(ids)
        return toks, lambda _: acts

    entries = [(feature, context, position)]
    return read_windows_many(entries, read_one, left, right, chunk, first_position)[0]


@torch.no_grad()
def read_windows_many(
    entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    read: ManyReader,
    left: int = 12,
    right: int = 4,
    chunk: int = 64,
    first_position: int = 0,
    every_dictionary: bool = False,
) -> list[Windows]:
    """`read_windows` for several dictionaries at once: `entries[i]` = (feature, context,
    position) of dictionary i; `read(contexts)` = (tokens [n, T], acts_of) with `acts_of(i)`
    dictionary i's activations [n, T, F_i] (asked for only where i kept one of the contexts, or
    for every dictionary with `every_dictionary`, where the reader counts what it reads; one
    dictionary at a time). One sweep over the union of the contexts, `chunk` at a time."""
    offsets = np.arange(-left, right + 1)
    out = []
    for feature, context, _ in entries:
        n = len(feature)
        order = np.argsort(context, kind="stable")
        out.append(([np.empty(0, np.int64)] * n, [np.empty(0, np.float32)] * n,
                    np.zeros(n, dtype=np.int64), order, context[order]))  # fmt: skip
    every = [c for _, c, _ in entries if len(c)]
    unique = np.unique(np.concatenate(every)) if every else np.empty(0, np.int64)
    for c0 in range(0, len(unique), chunk):
        ctxs = unique[c0 : c0 + chunk]
        toks, acts_of = read(ctxs)
        toks = torch.as_tensor(toks).long()
        t = toks.shape[1]
        for i, (feature, context, position) in enumerate(entries):
            tokens, values, start, order, sorted_ctx = out[i]
            # Every context between the chunk's first and last is in the chunk (the union holds
            # each dictionary's): the entries in it are one slice of the sorted ones.
            lo = np.searchsorted(sorted_ctx, ctxs[0], side="left")
            hi = np.searchsorted(sorted_ctx, ctxs[-1], side="right")
            rows = order[lo:hi]
            if not len(rows):
                if every_dictionary:
                    acts_of(i)
                continue
            acts = torch.as_tensor(acts_of(i)).float()
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
    return [
        (tokens, values, start, position - start)
        for (tokens, values, start, _, _), (_, _, position) in zip(out, entries, strict=True)
    ]
