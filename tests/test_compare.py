"""compare_runs: two runs with the same seed agree; a changed seed shows up in the diff."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO
from report_runs import small_run

from circuitflow.compare import collect, compare


def test_compare_tolerance_and_one_sided_keys():
    a = {"baseline/x/accuracy": 0.5, "sae/l0": 16.0, "top": ["L1H0", "L0H1"], "gone": 1}
    b = {"baseline/x/accuracy": 0.50001, "sae/l0": 17.0, "top": ["L1H0", "L0H1"], "new": 2}
    diffs = {d.key: d.kind for d in compare(a, b, rtol=1e-4, atol=1e-6)}
    assert diffs == {"sae/l0": "changed", "gone": "only_a", "new": "only_b"}
    assert compare(a, a) == []
    assert [d.key for d in compare({"t": ["a", "b"]}, {"t": ["a", "c"]})] == ["t"]


def _compare(a, b):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_same_seed_runs_agree_and_changed_seed_differs(tmp_path_factory):
    run_a = small_run(tmp_path_factory, "a", 0)
    run_b = small_run(tmp_path_factory, "b", 0)
    # A changed seed changes the model, hence the baseline: that part of the DAG is enough.
    run_c = small_run(tmp_path_factory, "c", 1, "baseline/induction.json")
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

    same = _compare(run_a, run_b)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "metrics agree" in same.stdout

    changed = _compare(run_a, run_c)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "changed: baseline/induction/model_weights_sha256" in changed.stdout
    assert "changed: baseline/induction/logit_diff_mean" in changed.stdout
    assert "only in A: interventions/induction/faithfulness" in changed.stdout

    missing = _compare(run_a, run_a.parent / "nowhere")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
