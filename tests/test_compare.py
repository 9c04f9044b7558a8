"""compare: the metric diff behind scripts/compare_runs.py (the DAG-level check is in
tests/workflow/test_compare_runs.py)."""

from __future__ import annotations

from circuitflow.compare import compare


def test_compare_tolerance_and_one_sided_keys():
    a = {"baseline/x/accuracy": 0.5, "sae/l0": 16.0, "top": ["L1H0", "L0H1"], "gone": 1}
    b = {"baseline/x/accuracy": 0.50001, "sae/l0": 17.0, "top": ["L1H0", "L0H1"], "new": 2}
    diffs = {d.key: d.kind for d in compare(a, b, rtol=1e-4, atol=1e-6)}
    assert diffs == {"sae/l0": "changed", "gone": "only_a", "new": "only_b"}
    assert compare(a, a) == []
    assert [d.key for d in compare({"t": ["a", "b"]}, {"t": ["a", "c"]})] == ["t"]
