"""A streaming accumulator of per-feature statistics over one dictionary's activations.

`Collector.update(tokens, acts)` takes one batch: `tokens` [B, T] (the batch's contexts, in the
order of the token set) and `acts` [B, T, n_features] float32, one dictionary's feature
activations at every position. It keeps, per feature:

- `count`: how many tokens it fired on (activation > 0; SAE activations are non-negative, so
  "fires" means positive); density = count / tokens seen;
- `hist`: a histogram of its positive activations over fixed log-spaced bins (`BIN_EDGES`,
  below), the same for every dictionary so histograms compare across layers, plus `max` and
  `sum` (the mean activation when firing is sum / count);
- the top-k max-activating tokens, each an int64 key that packs the activation and the token's
  global index (below), kept by a streaming merge;
- quantile samples: per feature and histogram bin, the `samples` tokens with the smallest
  pseudo-random priority (a hash of the seed, the feature and the token's global index), from
  which `result()` draws a few tokens from each activation quantile band.

**Keys, ties and determinism.** A token's global index is `context * T + position`, where
`context` counts the contexts fed so far (so the caller feeds the token set in order). A
top-k key is `float_bits(activation) << 32 | (2**32 - 1 - index)`: positive float32 values
order like their bit patterns, so keys order by activation and then by the earlier token, and
are unique per feature. The kept set is therefore the first k of a sort over all tokens by
(activation descending, index ascending), whatever the batch split. A sample key is `(2**31 - 1
- priority) << 32 | (2**32 - 1 - index)`: the largest keys are the smallest priorities, and
since priorities are a fixed hash of (seed, feature, index), the kept samples do not depend on
the batch split either. Keeping the s smallest priorities of each bin keeps the s smallest of
any union of bins (bottom-s sampling), so a band made of several bins gets a uniform sample of
its tokens without knowing the bands in advance. Indices must stay below 2**32 (4.29e9 tokens).

**Memory.** The state is `count` [F] (int64), `max` [F] (float32), `sum` [F] (float64), `hist`
[F, N_BINS], `top` [F, k] and `sample` [F * N_BINS, samples] (int64): `state_bytes(F, k,
samples)` = 20 F + 8 F (N_BINS + k + N_BINS * samples) bytes, whatever the number of tokens
(24,576 features, k = 20, 4 samples: 65.4 MB; 6,144 features: 16.3 MB).
A batch's own work is O(B * T * F) for the comparison that finds the firing entries and
O(nnz) after it: only candidates whose key beats the current k-th (or s-th) of their feature
are sorted. No window of tokens is kept: `windows.read_windows` materialises the windows of
the survivors at the end from the token set and a recomputation of their contexts only.

**Bins** (`BIN_EDGES`): 0, then 10**-3 .. 10**3 at ten bins a decade, then +inf: bin 0 holds
(0, 1e-3), bins 1..60 the log-spaced decades, bin 61 [1e3, inf); each bin is [lo, hi) as
numpy.histogram's (the edges are stored as float32, the dtype the comparisons run in).

**Across features** (`result()`): a histogram of log10(density) over `LOG_DENSITY_EDGES`
(-10 .. 0 at four bins a decade; dead features are counted apart), the dead features (never
fired) and the dense ones (density above `dense_threshold`, default 0.1: firing on more than
one token in ten, where a sparse dictionary's feature stops being selective).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# The histogram's bins, the quantile bands and the state's size: features/state.py (no numpy or
# torch there: the features plan reads them).
from circuitflow.features.state import LOG_BINS, LOG_DECADES, N_BINS, QUANTILE_BANDS, state_bytes

__all__ = [
    "BIN_EDGES",
    "LOG_DENSITY_EDGES",
    "N_BINS",
    "QUANTILE_BANDS",
    "Collector",
    "FeatureStats",
    "state_bytes",
]

BIN_EDGES = np.concatenate(
    [[0.0], 10.0 ** np.linspace(*LOG_DECADES, LOG_BINS + 1), [np.inf]]
).astype(np.float32)
LOG_DENSITY_EDGES = np.linspace(-10.0, 0.0, 41)

_LOW32 = 0xFFFFFFFF
_LOW31 = 0x7FFFFFFF
_EMPTY = -1  # a key slot with no token (every real key is >= 0)


def priority(index: torch.Tensor, feature: torch.Tensor, seed: int) -> torch.Tensor:
    """A 31-bit pseudo-random priority of each (token index, feature), fixed by the seed.

    Integer hash (xor-shift-multiply with 0x45d9f3b) in int64 with every product below 2**63,
    so it is exact on every platform."""
    x = (index & _LOW32) ^ ((feature * 0x9E3779B + seed * 0x632BE5AB) & _LOW32)
    for _ in range(2):
        x = (((x >> 16) ^ x) * 0x45D9F3B) & _LOW32
    x = (x >> 16) ^ x
    return x & _LOW31


def top_key(value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Pack positive float32 activations and token indices into unique, ordered int64 keys."""
    bits = value.contiguous().view(torch.int32).to(torch.int64)
    return (bits << 32) | (_LOW32 - index)


def key_value(key: torch.Tensor) -> torch.Tensor:
    """The activation a top-k key holds (NaN for an empty slot)."""
    bits = (key >> 32).to(torch.int32)
    return torch.where(key >= 0, bits.view(torch.float32), torch.nan)


def key_index(key: torch.Tensor) -> torch.Tensor:
    """The token index a key holds (-1 for an empty slot)."""
    return torch.where(key >= 0, _LOW32 - (key & _LOW32), -1)


def merge_top(state: torch.Tensor, group: torch.Tensor, key: torch.Tensor) -> None:
    """Merge candidate keys into `state` [G, k] (each row's k largest keys, descending).

    `group` [n] names each candidate's row. Only candidates above their row's current k-th key
    are sorted; rows no candidate reaches are not touched. In place."""
    k = state.shape[1]
    beats = key > state[group, k - 1]
    group, key = group[beats], key[beats]
    if not len(key):
        return
    order = torch.argsort(key, descending=True, stable=True)
    group, key = group[order], key[order]
    order = torch.argsort(group, stable=True)
    group, key = group[order], key[order]
    rows, counts = torch.unique_consecutive(group, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    dev = key.device
    rank = torch.arange(len(key), device=dev) - torch.repeat_interleave(starts, counts)
    keep = rank < k
    fresh = torch.full((len(rows), k), _EMPTY, dtype=torch.int64, device=dev)
    slot = torch.repeat_interleave(torch.arange(len(rows), device=dev), counts)
    fresh[slot[keep], rank[keep]] = key[keep]
    state[rows] = torch.cat([state[rows], fresh], dim=1).topk(k, dim=1).values


@dataclass
class FeatureStats:
    """What `Collector.result()` returns (numpy arrays; F features, k top entries, S samples).

    `top_*` [F, k] and `sample_*` [F, n_bands, S] hold activation, context and position
    (NaN / -1 where a feature has fewer); `band_lo`, `band_hi` [F, n_bands] the activation range
    of each band (the edges of its bins; NaN for a band no bin fell in) and `band_share`
    [F, n_bands] the fraction of the feature's firing tokens in the band."""

    n_tokens: int
    n_contexts: int
    context_length: int
    count: np.ndarray
    density: np.ndarray
    max: np.ndarray
    mean: np.ndarray
    hist: np.ndarray
    top_value: np.ndarray
    top_context: np.ndarray
    top_position: np.ndarray
    sample_context: np.ndarray
    sample_position: np.ndarray
    band_lo: np.ndarray
    band_hi: np.ndarray
    band_share: np.ndarray
    log_density_hist: np.ndarray
    dead: np.ndarray
    dense: np.ndarray
    dense_threshold: float
    seed: int


class Collector:
    """Streaming per-feature statistics over batches of one dictionary's activations.

    `first_position`: positions before it are not counted (1 leaves out a BOS token).
    `device`: where the state lives (the batch is moved there)."""

    def __init__(
        self,
        n_features: int,
        k: int = 20,
        samples: int = 4,
        seed: int = 0,
        dense_threshold: float = 0.1,
        first_position: int = 0,
        device: str | torch.device = "cpu",
    ):
        self.n_features, self.k, self.samples, self.seed = n_features, k, samples, seed
        self.dense_threshold = dense_threshold
        self.first_position = first_position
        self.device = torch.device(device)
        f, dev = n_features, self.device
        self.edges = torch.from_numpy(BIN_EDGES[1:-1]).to(dev)
        self.count = torch.zeros(f, dtype=torch.int64, device=dev)
        self.max = torch.zeros(f, dtype=torch.float32, device=dev)
        self.sum = torch.zeros(f, dtype=torch.float64, device=dev)
        self.hist = torch.zeros(f * N_BINS, dtype=torch.int64, device=dev)
        self.top = torch.full((f, k), _EMPTY, dtype=torch.int64, device=dev)
        self.sample = torch.full((f * N_BINS, samples), _EMPTY, dtype=torch.int64, device=dev)
        self.n_contexts = 0
        self.context_length: int | None = None

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {
            "count": self.count,
            "max": self.max,
            "sum": self.sum,
            "hist": self.hist,
            "top": self.top,
            "sample": self.sample,
        }

    def state_bytes(self) -> int:
        """Bytes of the state's tensors, as they are (`state_bytes()` predicts them)."""
        return sum(t.numel() * t.element_size() for t in self.state_tensors().values())

    def state_dict(self) -> dict:
        """Everything `update` has accumulated (CPU copies), for a checkpoint."""
        tensors = {name: t.cpu() for name, t in self.state_tensors().items()}
        return tensors | {"n_contexts": self.n_contexts, "context_length": self.context_length}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()` of a collector made with the same arguments."""
        for name, t in self.state_tensors().items():
            if tuple(state[name].shape) != tuple(t.shape):
                raise ValueError(
                    f"checkpoint's {name} {tuple(state[name].shape)} != {tuple(t.shape)}"
                )
            t.copy_(state[name])
        self.n_contexts = int(state["n_contexts"])
        self.context_length = state["context_length"]

    @torch.no_grad()
    def update(self, tokens: torch.Tensor | np.ndarray, acts: torch.Tensor) -> None:
        """Add one batch: `tokens` [B, T] (only their shape is used), `acts` [B, T, F]."""
        b, t = tuple(tokens.shape)
        if tuple(acts.shape) != (b, t, self.n_features):
            raise ValueError(f"acts {tuple(acts.shape)} do not match tokens {(b, t)}")
        if self.context_length is None:
            self.context_length = t
        elif t != self.context_length:
            raise ValueError(f"context length {t} differs from {self.context_length}")
        if (self.n_contexts + b) * t > _LOW32:
            raise ValueError("more than 2**32 tokens: token indices no longer fit a key")
        acts = acts.to(self.device, torch.float32)[:, self.first_position :]
        ctx, pos, feat = torch.nonzero(acts > 0, as_tuple=True)
        value = acts[ctx, pos, feat]
        index = (ctx + self.n_contexts) * t + pos + self.first_position
        self.n_contexts += b
        if not len(value):
            return
        f = self.n_features
        self.count += torch.bincount(feat, minlength=f)
        self.sum.index_add_(0, feat, value.double())
        self.max.scatter_reduce_(0, feat, value, reduce="amax")
        group = feat * N_BINS + torch.bucketize(value, self.edges, right=True)
        self.hist += torch.bincount(group, minlength=f * N_BINS)
        merge_top(self.top, feat, top_key(value, index))
        prio = priority(index, feat, self.seed)
        merge_top(self.sample, group, ((_LOW31 - prio) << 32) | (_LOW32 - index))

    @property
    def n_tokens(self) -> int:
        return self.n_contexts * max((self.context_length or 0) - self.first_position, 0)

    @torch.no_grad()
    def result(self, bands: tuple[float, ...] = QUANTILE_BANDS) -> FeatureStats:
        f, t = self.n_features, self.context_length or 1
        count = self.count.cpu().numpy()
        density = count / max(self.n_tokens, 1)
        hist = self.hist.view(f, N_BINS).cpu()
        top = self.top.cpu()
        top_index = key_index(top)
        # Each bin goes to the band holding the quantile at its middle.
        cum = torch.cumsum(hist, 1) - hist
        mid = (cum + hist / 2) / self.count.cpu().clamp(min=1)[:, None]
        q = torch.tensor(bands, dtype=mid.dtype)
        band_of_bin = (torch.bucketize(mid, q[1:-1], right=True)).where(hist > 0, -1)
        n_bands = len(bands) - 1
        sample = self.sample.view(f, N_BINS, self.samples).cpu()
        s_ctx = np.full((f, n_bands, self.samples), -1, dtype=np.int64)
        s_pos = np.full((f, n_bands, self.samples), -1, dtype=np.int64)
        lo = np.full((f, n_bands), np.nan, dtype=np.float32)
        hi = np.full((f, n_bands), np.nan, dtype=np.float32)
        share = np.zeros((f, n_bands))
        lo_edges, hi_edges = torch.from_numpy(BIN_EDGES[:-1]), torch.from_numpy(BIN_EDGES[1:])
        for band in range(n_bands):  # a handful of bands; vectorised over features
            inside = band_of_bin == band
            keys = sample.masked_fill(~inside[:, :, None], _EMPTY).reshape(f, -1)
            keys = keys.topk(min(self.samples, keys.shape[1]), dim=1).values
            idx = key_index(keys)
            s_ctx[:, band] = torch.where(idx >= 0, idx // t, -1).numpy()
            s_pos[:, band] = torch.where(idx >= 0, idx % t, -1).numpy()
            any_bin = inside.any(1)
            first = torch.where(inside, torch.arange(N_BINS), N_BINS).amin(1).clamp(max=N_BINS - 1)
            last = torch.where(inside, torch.arange(N_BINS), -1).amax(1).clamp(min=0)
            lo[:, band] = torch.where(any_bin, lo_edges[first], torch.nan).numpy()
            hi[:, band] = torch.where(any_bin, hi_edges[last], torch.nan).numpy()
            share[:, band] = ((hist * inside).sum(1) / self.count.cpu().clamp(min=1)).numpy()
        fired = count > 0
        log_hist, _ = np.histogram(np.log10(density[fired]), bins=LOG_DENSITY_EDGES)
        return FeatureStats(
            n_tokens=self.n_tokens,
            n_contexts=self.n_contexts,
            context_length=t,
            count=count,
            density=density,
            max=self.max.cpu().numpy(),
            mean=(self.sum.cpu() / self.count.cpu().clamp(min=1)).numpy(),
            hist=hist.numpy(),
            top_value=key_value(top).numpy(),
            top_context=torch.where(top_index >= 0, top_index // t, -1).numpy(),
            top_position=torch.where(top_index >= 0, top_index % t, -1).numpy(),
            sample_context=s_ctx,
            sample_position=s_pos,
            band_lo=lo,
            band_hi=hi,
            band_share=share,
            log_density_hist=log_hist,
            dead=np.flatnonzero(~fired),
            dense=np.flatnonzero(density > self.dense_threshold),
            dense_threshold=self.dense_threshold,
            seed=self.seed,
        )
