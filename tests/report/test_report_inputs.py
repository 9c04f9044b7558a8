"""The report reads other stages' files through one checked reader (report/inputs.py): a missing
file, or one without a key or column a page shows, stops the page with one line naming the file
and the key (exit status 2), where it had ended in a traceback or a blank cell."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from helpers.dag import REPO

from circuitflow.errors import InputError
from circuitflow.report.pages import baseline, behaviour, sae

BASELINE = {"behaviour": "ioi", "n_prompts": 8, "logit_diff_mean": 2.5, "logit_diff_std": 0.5,
            "corrupted_logit_diff_mean": -0.25, "accuracy": 0.875, "top1_accuracy": 0.75,
            "expected_calibration_error": 0.125, "brier_score": 0.0625,
            "calibration": [{"bin_low": 0.0}]}  # fmt: skip


def write(path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_baseline_page_shows_each_file_and_names_a_missing_key(tmp_path):
    write(tmp_path / "ioi.json", BASELINE)
    write(tmp_path / "facts.json", BASELINE | {"behaviour": "facts", "accuracy": 0.5})
    table = baseline.baseline_table([tmp_path / "ioi.json", tmp_path / "facts.json"])
    assert list(table.columns) == baseline.BASELINE_COLUMNS
    assert table["behaviour"].tolist() == ["ioi", "facts"]
    assert table["accuracy"].tolist() == [0.875, 0.5]
    assert table.iloc[0].to_dict() == {k: BASELINE[k] for k in baseline.BASELINE_COLUMNS}

    # Through the script: one line naming the file and the key, exit status 2.
    write(tmp_path / "old.json", {k: v for k, v in BASELINE.items() if k != "brier_score"})
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "report.py"), "baseline", "--json",
         tmp_path / "ioi.json", tmp_path / "old.json", "--out-csv", tmp_path / "b.csv",
         "--out-html", tmp_path / "b.html"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    old = tmp_path / "old.json"
    assert last == f"error: {old}: baseline summary without brier_score; rerun baseline"
    assert "Traceback" not in done.stderr and not (tmp_path / "b.html").exists()


def test_sae_metrics_without_kind_are_refused_not_filled_in(tmp_path):
    """Every dictionary source writes `kind` (sae/lifecycle.py METRICS_KEYS): a metrics.json
    without it is named, not shown as an SAE."""
    metrics = {c: 1.0 for c in sae.SAE_COLUMNS}
    metrics |= {"site": "resid_post", "layer": 1, "kind": "transcoder", "device": "cpu"}
    write(tmp_path / "a" / "metrics.json", metrics)
    write(tmp_path / "b" / "metrics.json", {k: v for k, v in metrics.items() if k != "kind"})
    table = sae.sae_table(sae.read_sae_metrics([tmp_path / "a"]))
    assert table["kind"].tolist() == ["transcoder"]
    with pytest.raises(
        InputError, match=r"b/metrics\.json: SAE metrics without kind; rerun the SAE stage$"
    ):
        sae.read_sae_metrics([tmp_path / "a", tmp_path / "b"])


def test_behaviour_page_names_a_missing_file_key_or_column(tmp_path):
    attr, iv = tmp_path / "attribution", tmp_path / "interventions"
    with pytest.raises(InputError, match=r"interventions/summary\.json: missing; rerun"):
        behaviour.behaviour_sections(attr, iv)
    write(iv / "summary.json", {k: None for k in behaviour.SUMMARY_KEYS if k != "circuit"})
    with pytest.raises(InputError, match="interventions summary without circuit; rerun"):
        behaviour.behaviour_sections(attr, iv)
    write(iv / "summary.json", {k: None for k in behaviour.SUMMARY_KEYS})
    attr.mkdir()
    pd.DataFrame({"layer": [0], "head": [1]}).to_parquet(attr / "heads.parquet")
    with pytest.raises(InputError, match=r"heads\.parquet: attribution heads table without "
                       r"column\(s\) score; rerun attribution"):  # fmt: skip
        behaviour.behaviour_sections(attr, iv)


def test_interventions_across_names_a_table_without_a_column(tmp_path):
    from circuitflow.interventions.across import across

    heads = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "score": [0.5, 0.0]})
    heads.assign(drop_frac=[0.5, 0.0]).to_parquet(tmp_path / "a.parquet")
    heads.to_parquet(tmp_path / "b.parquet")
    with pytest.raises(InputError, match=r"b\.parquet: single-head table without column\(s\) "
                       "drop_frac; rerun interventions"):  # fmt: skip
        across(["a", "b"], [tmp_path / "a.parquet", tmp_path / "b.parquet"],
               tmp_path / "out.parquet", tmp_path / "out.png")  # fmt: skip
    assert not (tmp_path / "out.parquet").exists()
