"""benchmarks/faults.py on .test/config/small.yaml: SIGKILLs of the whole Snakemake process
group inside every stage, each followed by the user's recovery (--unlock, then the same command
with --rerun-incomplete), one injected out-of-memory error per GPU stage and a full disk, and
the end results compared with an uninterrupted run: the shared small run (conftest), so this is
also the suite's check that two runs of one config agree (compare_runs exit 0)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from helpers.dag import REPO, prefork_socket

pytestmark = pytest.mark.slow


def test_killed_anywhere_the_run_resumes_to_the_same_results(small_results, tmp_path, monkeypatch):
    # Jobs forked from the warm interpreter (helpers.dag.prefork_socket): a SIGKILL of the
    # process group reaches each job as SIGKILL, a caught signal as itself (circuitflow.prefork).
    if os.environ.get("CIRCUITFLOW_TEST_PREFORK") != "0":
        monkeypatch.setenv("CIRCUITFLOW_PREFORK", prefork_socket())
    spec = importlib.util.spec_from_file_location("faults", REPO / "benchmarks" / "faults.py")
    faults = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(faults)
    out = tmp_path / "faults.json"
    args = ["--workdir", str(tmp_path / "runs"), "--out", str(out)]
    result = faults.main([*args, "--reference", str(small_results)])
    assert out.is_file()
    killed = {e["stage"] for e in result["kill_events"] if e["killed"]}
    assert {"capture", "train_sae", "attribution", "interventions"} <= killed, result
    assert result["kills"] >= 4
    assert result["kills_survived"] == result["kills"], result
    assert result["saes_resumed"] and all(result["saes_resumed"].values()), result
    assert result["outputs_identical"], result["compare_runs"]
    assert result["ooms"] == 4 and result["ooms_survived"] == 4, result["oom_stages"]
    disk = result["full_disk"]
    if "skipped" not in disk:
        assert disk["clear_error"] and disk["resumed_status"] == 0, disk
        if not disk["refused_before_any_job"]:
            assert disk["outputs_identical"], disk["compare_runs"]
