"""The size of what a features job keeps, without numpy or torch: a `collect.Collector`'s
histogram bins, the quantile bands of its samples and its state's bytes, and the shape of the
label rules' counts (rules.py, scores.py), which features/plan.py plans every features job by
(in every Snakemake invocation). collect.py and rules.py build their arrays from these.
"""

from __future__ import annotations

# A feature's activation histogram: bin 0 [0, 1e-3), LOG_BINS log-spaced bins over the decades
# LOG_DECADES (1e-3 .. 1e3), the last [1e3, inf) (collect.BIN_EDGES).
LOG_DECADES = (-3, 3)
LOG_BINS = 60
N_BINS = LOG_BINS + 2
# Quantile bands of a feature's positive activations: [0, 25%), [25%, 50%), [50%, 75%),
# [75%, 95%), [95%, 100%]; a bin goes to the band holding the quantile at its middle.
QUANTILE_BANDS = (0.0, 0.25, 0.5, 0.75, 0.95, 1.0)


def state_bytes(n_features: int, k: int, samples: int) -> int:
    """Bytes of a Collector's state, for a planner: it depends on nothing else."""
    return n_features * (20 + 8 * (N_BINS + k + N_BINS * samples))


# A label rule names at most MAX_ATOMS tokens; its conditions include position ranges cut at
# eighths of the context (rules.position_thresholds), and the counts keep a cell per position
# range x repeated token or not x repeated segment or not (rules.n_cells).
MAX_ATOMS = 3
# Tokens of each kind a feature's rule may name (scores.py says why 8).
CANDIDATES = 8


def position_thresholds(context_length: int) -> list[int]:
    """Positions q (at eighths of the context, distinct, 1 <= q < context_length) of the
    position conditions `at positions <= q` and `at positions > q`."""
    qs = {round(context_length * i / 8) for i in range(1, 8)}
    return sorted(q for q in qs if 1 <= q < context_length)


def n_cells(context_length: int) -> int:
    """Cells a position falls in: its position range (between consecutive thresholds) x
    whether its token is repeated x whether it sits in a repeated segment. Every condition is
    a union of cells, so counts per cell give counts per condition (rules.cell_conditions)."""
    return (len(position_thresholds(context_length)) + 1) * 4
