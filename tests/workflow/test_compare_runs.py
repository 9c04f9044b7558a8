"""compare_runs on the real DAG: a changed seed shows up in the diff; a missing directory is
exit 2. That two runs of one config agree is tests/workflow/test_faults.py's
claim (runs killed and resumed anywhere end with compare_runs exit 0 against an uninterrupted
one): a third whole run here would add minutes and no check."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.dag import REPO, load_test_config, run_snakemake

from circuitflow.compare import collect

pytestmark = pytest.mark.slow


def _compare(a, b):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_changed_seed_differs(small_results, tmp_path):
    small = load_test_config("small")
    run_a = small_results
    # A changed seed changes the model, hence the baseline: that part of the DAG is enough.
    target = tmp_path / "c" / "results" / "baseline" / "induction.json"
    run_snakemake(small | {"seed": 1}, tmp_path / "c", str(target), prefork=True)
    run_c = tmp_path / "c" / "results"
    metrics = collect(run_a)
    for key in (
        "baseline/induction/logit_diff_mean",
        "sae/resid_post/layer_1/l0",
        "sae/resid_post/layer_1/ce_loss_recovered",
        "attribution/induction/heads/top10",
        "interventions/induction/faithfulness",
        "interventions/induction/completeness",
    ):
        assert key in metrics, key

    changed = _compare(run_a, run_c)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "changed: baseline/induction/model_weights_sha256" in changed.stdout
    assert "changed: baseline/induction/logit_diff_mean" in changed.stdout
    assert "only in A: interventions/induction/faithfulness" in changed.stdout

    missing = _compare(run_a, run_a.parent / "nowhere")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
