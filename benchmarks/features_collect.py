#!/usr/bin/env python
"""Throughput and memory of the features accumulator (`circuitflow.features.collect`) on the
CPU: `--tokens` tokens of synthetic TopK-like activations (`--l0` random features firing per
token, log-uniform values) over `--features` features, fed in batches of `--batch` contexts of
`--context` tokens. The activations are made outside the timed region; the time is the
accumulator's alone (`update` and `result`). Prints tokens per second, the state's bytes
(`Collector.state_bytes`) and the process's peak resident memory; beside it, on the same
batches, the labels' counts (`circuitflow.features.scores.AtomCounts`, one dictionary's rules
counted on random tokens of a `--vocab` vocabulary, the features stage's candidates: 8 tokens of
each kind a feature) and their ratio to the accumulator's time.

    python benchmarks/features_collect.py --tokens 1000000 --features 6144
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from circuitflow.features.collect import Collector
from circuitflow.features.rules import KINDS, position_keys
from circuitflow.features.scores import AtomCounts, PositionCounts, Slots
from circuitflow.features.state import CANDIDATES


def label_counts(args, g) -> tuple[AtomCounts, PositionCounts]:
    """One dictionary's label counts with the stage's number of candidate tokens a feature."""
    n = args.features * len(KINDS) * CANDIDATES
    feature = torch.arange(args.features).repeat_interleave(len(KINDS) * CANDIDATES)
    kind = torch.arange(len(KINDS)).repeat_interleave(CANDIDATES).repeat(args.features)
    token = torch.randint(0, args.vocab, (n,), generator=g)
    where = PositionCounts(args.vocab, args.context)
    slots = Slots.of(feature.numpy(), kind.numpy(), token.numpy(), args.vocab)
    return AtomCounts(slots, args.features, where), where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=6144)
    ap.add_argument("--l0", type=int, default=64)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=50257)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    c = Collector(args.features, k=args.k, samples=args.samples, first_position=1)
    tokens = torch.zeros(args.batch, args.context, dtype=torch.long)
    n_batches = -(-args.tokens // (args.batch * args.context))
    acts = torch.zeros(args.batch, args.context, args.features)
    counts, where = label_counts(args, g)
    spent = spent_labels = 0.0
    for _ in range(n_batches):
        acts.zero_()
        idx = torch.randint(0, args.features, (args.batch, args.context, args.l0), generator=g)
        val = 10 ** (torch.rand(idx.shape, generator=g) * 3 - 1)
        acts.scatter_(2, idx, val)
        ids = torch.randint(0, args.vocab, (args.batch, args.context), generator=g)
        t0 = time.perf_counter()
        c.update(tokens, acts)
        spent += time.perf_counter() - t0
        t0 = time.perf_counter()
        keys, cells = position_keys(ids, 1)
        where.update(keys, cells)
        counts.update(keys, cells, acts[:, 1:].reshape(-1, args.features))
        spent_labels += time.perf_counter() - t0
    t0 = time.perf_counter()
    c.result()
    spent_result = time.perf_counter() - t0
    print(
        json.dumps(
            {
                **vars(args),
                "tokens_fed": c.n_tokens,
                "update_s": round(spent, 2),
                "result_s": round(spent_result, 2),
                "tokens_per_s": round(c.n_tokens / spent),
                "labels_s": round(spent_labels, 2),
                "labels_tokens_per_s": round(c.n_tokens / spent_labels),
                "labels_over_collector": round(spent_labels / spent, 2),
                "state_mb": round(c.state_bytes() / 2**20, 1),
                "batch_acts_mb": round(acts.numel() * 4 / 2**20, 1),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            }
        )
    )


if __name__ == "__main__":
    main()
