"""The streaming accumulator against brute force over all tokens (numpy), on random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitflow.features.collect import (
    BIN_EDGES,
    LOG_DENSITY_EDGES,
    N_BINS,
    QUANTILE_BANDS,
    Collector,
    state_bytes,
)

B, T, F, K, S = 48, 12, 40, 6, 3


def data(seed: int = 0, quantised: bool = True) -> np.ndarray:
    """[B, T, F] sparse non-negative activations over several decades; with `quantised`, values
    from a small set so ties are everywhere (also exactly on bin edges)."""
    rng = np.random.default_rng(seed)
    acts = 10.0 ** rng.uniform(-3.5, 3.5, size=(B, T, F))
    if quantised:
        acts = BIN_EDGES[1:-1][rng.integers(0, N_BINS - 1, size=(B, T, F))].astype(np.float64)
        acts *= rng.choice([1.0, 1.0, 1.5], size=acts.shape)
    fire = rng.random((B, T, F)) < rng.uniform(0.0, 0.5, size=F)  # per-feature densities
    fire[:, :, 0] = False  # a dead feature
    fire[:, :, 1] = True  # a dense one
    fire[:, :, 2] = False
    fire[3, 5, 2] = True  # fires once: fewer than k contexts
    return np.where(fire, acts, 0.0).astype(np.float32)


def collect(acts: np.ndarray, split: int, **kw) -> Collector:
    c = Collector(acts.shape[2], k=K, samples=S, seed=1, **kw)
    tokens = torch.zeros(acts.shape[:2], dtype=torch.long)
    for s in range(0, len(acts), split):
        c.update(tokens[s : s + split], torch.from_numpy(acts[s : s + split]))
    return c


def brute_top(acts: np.ndarray, k: int):
    """Per feature: sort every firing token by (activation descending, global index ascending)."""
    b, t, f = acts.shape
    flat = acts.reshape(b * t, f)
    value = np.full((f, k), np.nan, np.float32)
    ctx = np.full((f, k), -1)
    pos = np.full((f, k), -1)
    for j in range(f):
        idx = np.flatnonzero(flat[:, j] > 0)
        idx = idx[np.lexsort((idx, -flat[idx, j]))][:k]
        value[j, : len(idx)] = flat[idx, j]
        ctx[j, : len(idx)], pos[j, : len(idx)] = idx // t, idx % t
    return value, ctx, pos


@pytest.mark.parametrize("split", [1, 5, 7, B])
@pytest.mark.parametrize("quantised", [True, False])
def test_top_k_equals_brute_force_sort(split, quantised):
    acts = data(quantised=quantised)
    r = collect(acts, split).result()
    value, ctx, pos = brute_top(acts, K)
    np.testing.assert_array_equal(r.top_value, value)
    np.testing.assert_array_equal(r.top_context, ctx)
    np.testing.assert_array_equal(r.top_position, pos)
    assert np.isnan(r.top_value[0]).all() and (r.top_value[2, 1:] != r.top_value[2, 1:]).all()


def test_ties_are_broken_by_the_earlier_token():
    acts = np.zeros((4, 3, 1), np.float32)
    acts[[3, 0, 2, 1], [0, 2, 1, 0], 0] = 2.0  # four ties, fed out of order
    r = collect(acts, 1).result()
    assert r.top_context[0, :4].tolist() == [0, 1, 2, 3]
    assert r.top_position[0, :4].tolist() == [2, 0, 1, 0]


@pytest.mark.parametrize("split", [3, B])
def test_density_histogram_and_maximum_equal_numpy(split):
    acts = data(quantised=True)
    r = collect(acts, split).result()
    flat = acts.reshape(-1, F)
    count = (flat > 0).sum(0)
    np.testing.assert_array_equal(r.count, count)
    np.testing.assert_allclose(r.density, count / (B * T))
    edges = BIN_EDGES.astype(np.float32).copy()
    edges[-1] = np.finfo(np.float32).max
    for j in range(F):
        v = flat[flat[:, j] > 0, j]
        np.testing.assert_array_equal(r.hist[j], np.histogram(v, bins=edges)[0])
        assert r.max[j] == (v.max() if len(v) else 0.0)
        np.testing.assert_allclose(r.mean[j], v.astype(np.float64).mean() if len(v) else 0.0)
    fired = count > 0
    ref, _ = np.histogram(np.log10(count[fired] / (B * T)), bins=LOG_DENSITY_EDGES)
    np.testing.assert_array_equal(r.log_density_hist, ref)
    np.testing.assert_array_equal(r.dead, np.flatnonzero(count == 0))
    np.testing.assert_array_equal(r.dense, np.flatnonzero(count / (B * T) > 0.1))
    assert 0 in r.dead and 1 in r.dense and r.n_tokens == B * T


def test_first_position_is_not_counted():
    acts = data()
    r = collect(acts, 5, first_position=2).result()
    ref = collect(np.ascontiguousarray(acts[:, 2:]), 5).result()
    np.testing.assert_array_equal(r.count, ref.count)
    np.testing.assert_array_equal(r.hist, ref.hist)
    np.testing.assert_array_equal(r.top_value, ref.top_value)
    np.testing.assert_array_equal(
        r.top_position, np.where(ref.top_position >= 0, ref.top_position + 2, -1)
    )
    assert r.n_tokens == B * (T - 2)


def test_memory_does_not_grow_with_tokens():
    rng = np.random.default_rng(3)
    c = Collector(F, k=K, samples=S)
    tokens = torch.zeros(B, T, dtype=torch.long)

    def feed(n):
        for _ in range(n):
            a = rng.random((B, T, F), dtype=np.float32)
            c.update(tokens, torch.from_numpy(np.where(a > 0.7, a, 0)))

    feed(10)
    before = {n: (t.shape, t.dtype) for n, t in c.state_tensors().items()}
    bytes_10 = c.state_bytes()
    feed(100)
    assert c.state_bytes() == bytes_10 == state_bytes(F, K, S)
    assert bytes_10 == F * (8 + 4 + 8) + 8 * F * (N_BINS + K + N_BINS * S)  # by hand
    assert {n: (t.shape, t.dtype) for n, t in c.state_tensors().items()} == before
    assert c.n_tokens == 110 * B * T


def reference_bands(acts: np.ndarray):
    """Each band's [lo, hi) from numpy's histogram: a bin belongs to the band that holds the
    quantile at its middle (its tokens' cumulative share halfway through the bin)."""
    edges = BIN_EDGES.astype(np.float64)
    n_bands = len(QUANTILE_BANDS) - 1
    lo = np.full((acts.shape[2], n_bands), np.nan, np.float32)
    hi = lo.copy()
    for j in range(acts.shape[2]):
        v = acts[..., j][acts[..., j] > 0]
        if not len(v):
            continue
        hist = np.histogram(v, bins=np.r_[edges[:-1], np.finfo(np.float32).max])[0]
        mid = (np.cumsum(hist) - hist / 2) / len(v)
        for i in np.flatnonzero(hist):
            band = np.searchsorted(QUANTILE_BANDS, mid[i], side="right") - 1
            lo[j, band] = min(lo[j, band], edges[i]) if lo[j, band] == lo[j, band] else edges[i]
            hi[j, band] = edges[i + 1]
    return lo, hi


@pytest.mark.parametrize("quantised", [True, False])
def test_quantile_samples_fall_in_their_bands_whatever_the_split(quantised):
    acts = data(quantised=quantised)
    r = collect(acts, 7).result()
    r2 = collect(acts, 1).result()
    np.testing.assert_array_equal(r.sample_context, r2.sample_context)
    np.testing.assert_array_equal(r.sample_position, r2.sample_position)
    n_bands = r.band_lo.shape[1]
    ref_lo, ref_hi = reference_bands(acts)
    seen = 0
    for j in range(F):
        firing = np.sort(acts[..., j][acts[..., j] > 0])
        if not len(firing):
            assert (r.sample_context[j] == -1).all()
            continue
        np.testing.assert_allclose(r.band_share[j].sum(), 1.0)
        for band in range(n_bands):
            ctx, pos = r.sample_context[j, band], r.sample_position[j, band]
            got = ctx >= 0
            if np.isnan(r.band_lo[j, band]):
                assert not got.any()
                continue
            v = acts[ctx[got], pos[got], j]
            assert ((v >= r.band_lo[j, band]) & (v < r.band_hi[j, band])).all()
            in_band = ((firing >= r.band_lo[j, band]) & (firing < r.band_hi[j, band])).sum()
            assert got.sum() == min(S, in_band)  # as many as the band holds, up to S
            np.testing.assert_allclose(r.band_share[j, band], in_band / len(firing))
            assert len(set(zip(ctx[got], pos[got], strict=True))) == got.sum()
            seen += got.sum()
        np.testing.assert_array_equal(r.band_lo[j], ref_lo[j])
        np.testing.assert_array_equal(r.band_hi[j], ref_hi[j])
    assert seen > F  # most features have samples in several bands


def test_samples_change_with_the_seed_only():
    acts = data(quantised=False)
    a = collect(acts, 5).result()
    b = Collector(F, k=K, samples=S, seed=2)
    b.update(torch.zeros(B, T, dtype=torch.long), torch.from_numpy(acts))
    assert (a.sample_context != b.result().sample_context).any()


def test_samples_are_uniform_over_the_band():
    """One feature at one value everywhere (one band): over many seeds, the sampled tokens
    spread evenly over the contexts (a priority that favours early tokens fails this)."""
    acts = np.ones((B, T, 1), np.float32)
    late = []
    for seed in range(100):
        c = Collector(1, k=1, samples=S, seed=seed)
        c.update(torch.zeros(B, T, dtype=torch.long), torch.from_numpy(acts))
        ctx = c.result().sample_context[0]
        late.extend((ctx[ctx >= 0] >= B // 2).tolist())
    assert len(late) == 100 * S
    assert 0.4 < np.mean(late) < 0.6
