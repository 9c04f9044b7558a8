"""circuitflow.prefork, the warm interpreter the suite's whole-DAG runs fork their model-loading
jobs from: a forked job must be the job `python SCRIPT ARGS...` would have been (directory,
environment, arguments, streams, exit status, outputs), get the signals its client gets, and run
without a server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.dag import REPO, load_test_config, prefork_socket, run_snakemake

SCRIPT = """
import json, os, signal, sys, time
if sys.argv[1] == "sleep":
    def checkpoint(*_):
        open("terminated", "w").write(str(os.getpid()))
        sys.exit(3)
    signal.signal(signal.SIGTERM, checkpoint)
    open("pid", "w").write(str(os.getpid()))
    time.sleep(60)
if sys.argv[1] == "raise":
    raise ValueError("a bad value")
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE"),
                  "stdin": sys.stdin.read(), "path0": sys.path[0]}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def client(socket: str, script: Path, *args: str, cwd: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PROBE": "from the client"}
    return subprocess.Popen(
        [sys.executable, "-m", "circuitflow.prefork", socket, str(script), *args],
        cwd=cwd, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def socket() -> str:
    return prefork_socket(listening=True)


@pytest.mark.parametrize("served", [True, False], ids=["forked", "no server"])
def test_a_job_gets_the_clients_directory_environment_arguments_and_streams(
    served, socket, tmp_path
):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    (tmp_path / "cwd").mkdir()
    proc = client(socket if served else str(tmp_path / "no-socket"), script, "3", "x y",
                  cwd=tmp_path / "cwd")  # fmt: skip
    out, err = proc.communicate("from stdin", timeout=60)
    assert proc.returncode == 3, err
    seen = json.loads(out)
    assert seen == {"argv": [str(script), "3", "x y"], "cwd": str(tmp_path / "cwd"),
                    "env": "from the client", "stdin": "from stdin",
                    "path0": str(tmp_path)}  # fmt: skip
    assert err.strip() == "to stderr"


def test_a_failing_job_exits_non_zero_with_its_traceback(socket, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    proc = client(socket, script, "raise", cwd=tmp_path)
    _, err = proc.communicate("", timeout=60)
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1] == "ValueError: a bad value"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_client_reaches_the_job(sig, socket, tmp_path):
    """SIGTERM (Snakemake cancelling, Slurm's walltime) goes on to the script, which may
    checkpoint and exit with its own status; a client killed outright takes the job along."""
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    proc = client(socket, script, "sleep", cwd=tmp_path)
    pid_file = tmp_path / "pid"
    deadline = time.time() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    proc.send_signal(sig)
    proc.wait(timeout=30)
    if sig == signal.SIGTERM:
        assert proc.returncode == 3 and (tmp_path / "terminated").read_text() == str(pid)
    deadline = time.time() + 30
    while Path(f"/proc/{pid}").exists() and _state(pid) != b"Z":
        assert time.time() < deadline, "the forked job outlived its client"
        time.sleep(0.1)


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().split(b") ")[1][:1]
    except (FileNotFoundError, IndexError):
        return b"Z"


def test_a_forked_stage_job_writes_what_a_fresh_interpreter_writes(tiny_model, tmp_path):
    """The baseline of the tiny config, forked and in a fresh interpreter: the same bytes."""
    config = load_test_config("tiny")
    outputs = {}
    for prefork in (True, False):
        results = tmp_path / str(prefork) / "results"
        shutil.copytree(tiny_model, results)  # times kept: the model is not trained again
        target = results / "baseline" / "induction.json"
        done = run_snakemake(config, results.parent, "-p", str(target), prefork=prefork)
        assert ("-m circuitflow.prefork" in done.stdout + done.stderr) == prefork
        log = (results / "logs" / "baseline" / "induction.log").read_text()
        outputs[prefork] = json.loads(target.read_text()), log
    assert outputs[True][0] == outputs[False][0]
    assert "Traceback" not in outputs[True][1]
