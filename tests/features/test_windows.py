"""Windows read back for the kept contexts equal slices of the activations themselves."""

from __future__ import annotations

import numpy as np

from circuitflow.features.windows import read_windows


def test_windows_are_slices_of_the_contexts():
    rng = np.random.default_rng(0)
    n_ctx, t, f = 30, 9, 5
    tokens = rng.integers(0, 100, size=(n_ctx, t))
    acts = rng.random((n_ctx, t, f), dtype=np.float32)
    reads = []

    def read(ids):
        reads.append(list(ids))
        return tokens[ids], acts[ids]

    feature = rng.integers(0, f, 200)
    context = rng.integers(0, n_ctx, 200)
    position = rng.integers(1, t, 200)
    toks, vals, start, qual = read_windows(
        feature, context, position, read, left=3, right=2, chunk=7, first_position=1
    )
    for i in range(200):
        lo, hi = max(position[i] - 3, 1), min(position[i] + 3, t)
        assert start[i] == lo and qual[i] == position[i] - lo
        np.testing.assert_array_equal(toks[i], tokens[context[i], lo:hi])
        np.testing.assert_array_equal(vals[i], acts[context[i], lo:hi, feature[i]])
    flat = [c for chunk in reads for c in chunk]
    assert sorted(flat) == sorted(set(context.tolist()))  # each context read once
    assert max(len(chunk) for chunk in reads) <= 7


def test_dictionaries_sharing_a_pass_read_each_context_once():
    """read_windows_many over three dictionaries: each one's windows are slices of its own
    activations, every context of their union is read once, and a dictionary's activations are asked
    for only in the chunks holding one of its contexts."""
    from circuitflow.features.windows import read_windows_many

    rng = np.random.default_rng(1)
    n_ctx, t = 40, 8
    tokens = rng.integers(0, 100, size=(n_ctx, t))
    acts = [rng.random((n_ctx, t, f), dtype=np.float32) for f in (3, 5, 4)]
    entries = []
    for i, a in enumerate(acts):
        n = 60 if i < 2 else 0 if i == 2 else 1  # the third keeps nothing
        entries.append((rng.integers(0, a.shape[2], n), rng.integers(0, 25 + 15 * i, n),
                        rng.integers(0, t, n)))  # fmt: skip
    reads, asked = [], []

    def read(ids):
        reads.append(list(ids))
        return tokens[ids], lambda i: asked.append((len(reads), i)) or acts[i][ids]

    got = read_windows_many(entries, read, left=2, right=1, chunk=6, first_position=1)
    for i, (feature, context, position) in enumerate(entries):
        toks, vals, start, qual = got[i]
        for j in range(len(feature)):  # against the arrays themselves
            lo, hi = max(position[j] - 2, 1), min(position[j] + 2, t)
            assert start[j] == lo and qual[j] == position[j] - lo
            np.testing.assert_array_equal(toks[j], tokens[context[j], lo:hi])
            np.testing.assert_array_equal(vals[j], acts[i][context[j], lo:hi, feature[j]])
    union = set(np.concatenate([c for _, c, _ in entries]).tolist())
    flat = [c for chunk in reads for c in chunk]
    assert sorted(flat) == sorted(union)
    assert all(i != 2 for _, i in asked)  # never asked for the dictionary that kept nothing
    assert len(asked) < 2 * len(reads)  # the first two miss some chunks of the union
