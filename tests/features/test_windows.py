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
