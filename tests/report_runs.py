"""Small DAG runs shared by the report and compare tests (run once per test session)."""

from __future__ import annotations

import copy
from pathlib import Path

from conftest import TINY_EMBEDDED, run_snakemake

# TINY_EMBEDDED cut further: one behaviour, one layer, few prompts, seeds and random controls.
SMALL = copy.deepcopy(TINY_EMBEDDED)
SMALL["behaviours"] = {"induction": {"source": "induction", "n_prompts": 16}}
SMALL["layers"] = [1]
SMALL["capture"] = {"n_tokens": 8192}
SMALL["sae"] |= {"total_tokens": 20480, "checkpoint_every_tokens": 10240,
                 "dead_window_tokens": 10240}  # fmt: skip
SMALL["attribution"] = {"ig_steps": 4, "exact_features": 4}
SMALL["interventions"] = {"n_seeds": 2, "n_random_circuits": 3, "n_random_sets": 3}


def small_run(tmp_path_factory, name: str, seed: int = 0, *targets: str) -> Path:
    """Results directory of the small config with `seed` (the whole DAG, or `targets`: paths
    under results/), computed on first use and reused by later tests of the session."""
    workdir = tmp_path_factory.getbasetemp() / f"small-{name}"
    marker = workdir / "done"
    if not marker.exists():
        paths = [str(workdir / "results" / t) for t in targets]
        run_snakemake({**SMALL, "seed": seed}, workdir, *paths)
        marker.write_text("ok")
    return workdir / "results"
