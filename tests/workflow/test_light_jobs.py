"""Jobs that need no model import no model library (issue 56): on 2 cores torch alone costs a
job about 1.5 CPU-s before any work, TransformerLens 4-6 more, and a workstation run has a dozen
report jobs. The rule table (circuitflow.resources) states what each rule's process imports
(memory.runtime.RUNTIME_MODULES, which its memory plan adds); here the report's rules of a copy
of the small run run again with Python's import profile on, and each job's log must show no heavy
library that its kind does not list."""

from __future__ import annotations

import shutil
import time

import pytest
from helpers.dag import load_test_config, run_snakemake

from circuitflow import resources
from circuitflow.memory.runtime import RUNTIME_MODULES

pytestmark = pytest.mark.slow

HEAVY = ("torch", "transformer_lens", "sae_lens", "transformers", "datasets")
# The rules run again: every one whose downstream is report rules too (job_costs, provenance_run
# follow them), so no model job runs.
REPORT_RULES = (
    "interventions_across", "sae_summary", "report_baseline", "report_behaviour",
    "report_provenance", "report_features_dictionary", "report_features", "report_gpu_hours",
    "job_costs", "provenance_run",
)  # fmt: skip


def imported(log: str) -> set[str]:
    """Top-level packages a job imported, from its log's `-X importtime` lines."""
    names = set()
    for line in log.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_report_jobs_import_no_model_library(small_results, tmp_path):
    allowed = {
        rule: {m.split(".")[0] for m in RUNTIME_MODULES[resources.RULES[rule].imports]}
        for rule in REPORT_RULES
    }
    assert all("torch" not in kinds for kinds in allowed.values()), allowed
    results = tmp_path / "results"
    shutil.copytree(small_results, results)  # times kept: nothing upstream reruns
    start = time.time()
    run_snakemake(
        load_test_config("small") | {"outdir": str(results)}, tmp_path, "--forcerun", *REPORT_RULES,
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )  # fmt: skip
    logs = [p for p in (results / "logs").rglob("*.log") if p.stat().st_mtime >= start]
    assert len(logs) >= len(REPORT_RULES), sorted(map(str, logs))
    assert all(imported(p.read_text()) for p in logs), "a log without the import profile"
    heavy = {str(p.relative_to(results)): set(HEAVY) & imported(p.read_text()) for p in logs}
    assert {log: names for log, names in heavy.items() if names} == {}
