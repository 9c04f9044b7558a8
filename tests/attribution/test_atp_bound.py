"""benchmarks/atp_bound.py, the evidence for how far attribution patching can rank nodes as exact
patching does, on the shared small run: it finds the nodes and prompts the stage patched exactly
(its own exact patching reproduces the stage's `score_exact`) and ranks every method on them."""

from __future__ import annotations

import json
import runpy

import pytest
from helpers.dag import REPO

pytestmark = pytest.mark.slow


def test_atp_bound_reproduces_the_stages_exact_scores(small_results, tmp_path, monkeypatch):
    out = tmp_path / "atp_bound.json"
    args = ["--results", str(small_results), "--behaviour", "induction", "--json", str(out)]
    monkeypatch.setattr("sys.argv", ["atp_bound.py", *args])
    runpy.run_path(str(REPO / "benchmarks" / "atp_bound.py"), run_name="__main__")
    report = json.loads(out.read_text())
    summary = json.loads((small_results / "attribution" / "induction" / "summary.json").read_text())
    assert report["n_prompts"] == summary["n_validation_prompts"]
    assert report["exact_matches_stage"] < 1e-5
    methods = {"atp_plain", "atp", "atp_qk_oracle", "atp_qk_oracle_direct"}
    for kind in ("head", "feature"):
        row = report["spearman"][kind]
        assert row["n_nodes"] == summary["validation"]["by_kind"][kind]["n_nodes"] > 2
        assert methods <= set(row) and all(-1 <= row[m] <= 1 for m in methods), row
