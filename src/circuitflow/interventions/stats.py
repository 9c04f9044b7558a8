"""Effects over seeds and prompts: bootstrap resamples per seed, t-intervals, cached runs."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from circuitflow.interventions.ablation import Intervener, Outcome, Request, calibration_error
from circuitflow.interventions.config import InterventionsConfig


def seeds_for(cfg: InterventionsConfig, base_seed: int) -> list[int]:
    return [base_seed + i for i in range(cfg.n_seeds)]


def bootstrap_rows(n: int, seed: int) -> np.ndarray:
    """The prompts of one seed's bootstrap resample (with replacement)."""
    return np.random.default_rng([seed, 1000003]).integers(0, n, n)


def t_interval(x: np.ndarray, level: float) -> tuple[float, float, float]:
    """(low, high, two-sided p-value against mean 0) of the mean of x."""
    from scipy import stats

    n = len(x)
    mean = float(np.mean(x))
    if n < 2 or np.std(x) == 0:
        return mean, mean, (1.0 if mean == 0 else 0.0)
    se = float(np.std(x, ddof=1) / np.sqrt(n))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
    return mean - half, mean + half, p


class Runs:
    """Cached ablation runs: zero and mean ablations do not depend on the seed, so one run
    serves every seed; resample ablation draws anew per seed."""

    def __init__(self, iv: Intervener, seeds: list[int]):
        self.iv = iv
        self.seeds = seeds
        self.cache: dict[tuple, Outcome] = {}
        self._queued: dict[tuple, Request] = {}
        self.base = iv.run(())
        self.n_runs = 1

    def _key(self, nodes: frozenset, seed: int) -> tuple:
        return (nodes, seed if self.iv.kind == "resample" else None)

    def prefetch(
        self, node_sets: Iterable, seeds: Iterable[int] | None = None, defer: bool = False
    ) -> None:
        """Run every (node set, seed) not cached yet, many runs per forward pass (see
        `Intervener.run_many`), so that later `get`s are cache hits. With `defer`, only queue
        them until `flush`."""
        for nodes in node_sets:
            nodes = frozenset(nodes)
            for seed in self.seeds if seeds is None else seeds:
                key = self._key(nodes, seed)
                if nodes and key not in self.cache and key not in self._queued:
                    self._queued[key] = Request(nodes, seed)
        if not defer:
            self.flush()

    def flush(self) -> None:
        """Run the queued (node set, seed)s."""
        queued, self._queued = self._queued, {}
        for key, outcome in zip(queued, self.iv.run_many(list(queued.values())), strict=True):
            self.cache[key] = outcome
        self.n_runs += len(queued)

    def get(self, nodes, seed: int) -> Outcome:
        nodes = frozenset(nodes)
        if not nodes:
            return self.base
        key = self._key(nodes, seed)
        if key not in self.cache:
            self.cache[key] = self.iv.run(sorted(nodes), seed=seed)
            self.n_runs += 1
        return self.cache[key]

    def effect(self, nodes, level: float) -> dict[str, float]:
        """Effect of ablating `nodes` together: mean and std across seeds, CI over prompts."""
        base = self.base
        per_seed = []
        for seed in self.seeds:
            out = self.get(nodes, seed)
            idx = bootstrap_rows(len(base.logit_diff), seed)
            m0, m1 = base.logit_diff[idx].mean(), out.logit_diff[idx].mean()
            per_seed.append(
                {
                    "score": m0 - m1,
                    "drop_frac": (m0 - m1) / m0 if m0 != 0 else np.nan,
                    "logit_diff": m1,
                    "accuracy": out.correct[idx].mean(),
                    "accuracy_change": out.correct[idx].mean() - base.correct[idx].mean(),
                }
            )
        frame = pd.DataFrame(per_seed)
        row: dict[str, float] = {}
        for col in frame:
            row[col] = float(frame[col].mean())
            row[f"{col}_std"] = float(frame[col].std(ddof=1)) if len(frame) > 1 else 0.0
        first = self.get(nodes, self.seeds[0])
        low, high, p = t_interval(base.logit_diff - first.logit_diff, level)
        row |= {"score_ci_low": low, "score_ci_high": high, "p_value": p}
        ece = calibration_error(first)
        row |= {"calibration_error": ece, "calibration_error_change": ece - self.base_ece}
        return row

    @property
    def base_ece(self) -> float:
        if not hasattr(self, "_base_ece"):
            self._base_ece = calibration_error(self.base)
        return self._base_ece
