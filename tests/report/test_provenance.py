"""Provenance collected after the stages: failed jobs from Snakemake's logs and sacct, and the
installed distributions."""

from __future__ import annotations


def test_failed_jobs_and_sacct_parsing(tmp_path, monkeypatch):
    from circuitflow import provenance

    log_dir = tmp_path / "log"
    log_dir.mkdir()
    out = tmp_path / "results"
    (log_dir / "2026-01-01T000000.snakemake.log").write_text(
        "Error in rule train_sae:\n"
        "    message: SLURM-job '16' failed, SLURM status is: 'TIMEOUT'.\n"
        "    jobid: 4\n"
        f"    output: {out}/saes/resid_post/layer_1\n"
        f"    log: {out}/logs/train_sae/l1.log (check log file(s) for error details)\n"
        "Error in rule baseline:\n"
        "    jobid: 5\n"
        "    output: /elsewhere/results/baseline/x.json\n"
    )
    sacct = (
        "16|uuid|rule_train_sae_wildcards_resid_post_1|TIMEOUT|0:0|00:10:00|a|b|ampere|||1G|/w\n"
    )
    rows = provenance.parse_sacct(sacct)
    assert rows[0]["jobid"] == "16" and rows[0]["state"] == "TIMEOUT"
    failed = provenance.failed_jobs(log_dir, out, None, {"jobs": [rows[0] | {"rule": "train_sae"}]})
    assert [(f["source"], f["rule"]) for f in failed] == [
        (".snakemake/log/2026-01-01T000000.snakemake.log", "train_sae"),
        ("sacct", "train_sae"),
    ]
    assert "TIMEOUT" in failed[0]["reason"] and "TIMEOUT" in failed[1]["reason"]
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert provenance.slurm_jobs(tmp_path, None)["jobs"] == []


def test_pip_freeze_lists_what_pip_freeze_lists(monkeypatch):
    """Read in-process from the distributions' metadata, the list is pip's own (`pip freeze
    --all` of the same interpreter, its comment lines aside). An editable project is its path:
    pip asks git for a clone's remote and commit, which environment.json records."""
    import subprocess
    import sys

    from helpers.dag import REPO

    from circuitflow import provenance

    pip = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    # As in a job, whose PYTHONPATH puts src/ (and the egg-info an editable install leaves
    # there) before site-packages.
    monkeypatch.syspath_prepend(str(REPO / "src"))
    ours = provenance.pip_freeze().splitlines()
    assert f"-e {REPO}" in ours  # circuitflow, installed editable
    assert sum(line.startswith("-e ") for line in pip) == 1
    assert sorted(set(ours) - {f"-e {REPO}"}) == sorted(
        line for line in pip if not line.startswith(("#", "-e "))
    )
