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


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device", "/out/acts.h5"),
        RuntimeError("Can't write data (file write failed: errno = 28, 'No space left on device')"),
    ],
    ids=["os", "h5py"],
)
def test_full_disk_is_one_line_and_its_own_exit_status(error, capsys):
    from circuitflow.cli import main
    from circuitflow.errors import EXIT_NO_SPACE

    def run():
        raise error

    with pytest.raises(SystemExit) as info:
        main(run)
    assert info.value.code == EXIT_NO_SPACE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: no space left on device")
    assert "rerun the same command" in err


def test_other_runtime_errors_keep_their_traceback():
    from circuitflow.cli import main

    def run():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        main(run)
