"""Every stage script is a real command-line program: --help works, bad input exits non-zero
with one line that names the problem."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.dag import REPO

SCRIPTS = sorted(p for p in (REPO / "scripts").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_help(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_missing_model_is_one_clear_line(tmp_path):
    args = ["--config", tmp_path / "x.yaml", "--behaviour", "induction"]
    args += ["--model-json", tmp_path / "model.json", "--out", tmp_path / "p.parquet"]
    script = REPO / "scripts" / "prompts.py"
    done = subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: config file")
    assert "x.yaml does not exist" in done.stderr
    assert not (tmp_path / "p.parquet").exists()
