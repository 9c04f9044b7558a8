"""The size of what a features `collect.Collector` keeps, without numpy or torch: its histogram's
bins, the quantile bands of its samples and its state's bytes, which features/plan.py plans
every features job by (in every Snakemake invocation). collect.py builds its arrays from these.
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
