"""A capture killed mid-run (SIGKILL, or SIGTERM as Slurm sends at walltime) resumes on rerun
from its last checkpoint and writes the same bytes as an uninterrupted run (fp32, CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from helpers.dag import REPO

from circuitflow.capture import tokens as corpus
from circuitflow.capture.config import CaptureConfig
from circuitflow.capture.files import open_activations, partial_path
from circuitflow.errors import EXIT_CHECKPOINTED, ActivationFileError
from circuitflow.model.embedded import EmbeddedModelConfig, TrainingConfig, train

CAPTURE = {
    "n_tokens": 31 * 640,
    "corpus": None,
    "split": "train",
    "text_column": "text",
    "context_length": None,
    "exclude_bos": True,
    "dtype": "float32",
    "batch_size": 4,
    "max_batch_size": 256,
    "memory_fraction": 0.8,
    "checkpoint_tokens": 31 * 16,
    "shards": 1,
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    model_dir = root / "model"
    train(EmbeddedModelConfig(training=TrainingConfig(steps=2, log_every=1)), model_dir)
    toks, meta = corpus.build_token_set(CaptureConfig.from_dict(CAPTURE), 0, model_dir)
    corpus.write_token_set(toks, meta, root / "tokens.npy", root / "tokens.json")
    config = {
        "seed": 0,
        "device": "cpu",
        "model": {"name": "embedded", "dtype": "float32"},
        "layers": [0, 1],
        "sites": ["resid_post", "mlp_out"],
        "capture": CAPTURE,
    }
    return root, model_dir, json.dumps(config)


def command(setup, out: Path) -> list[str]:
    root, model_dir, config = setup
    return [
        sys.executable, str(REPO / "scripts" / "capture.py"), "run", "--config", config,
        "--model-json", str(model_dir / "model.json"), "--tokens-npy", str(root / "tokens.npy"),
        "--tokens-json", str(root / "tokens.json"), "--out-dir", str(out),
    ]  # fmt: skip


def env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def outputs(out: Path) -> list[Path]:
    return [out / s / f"layer_{n}.h5" for s in ("resid_post", "mlp_out") for n in (0, 1)]


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    subprocess.run(command(setup, out), check=True, env=env(), capture_output=True, timeout=300)
    return out


def kill_after_checkpoints(cmd, sig, n_checkpoints=3):
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env())
    seen = 0
    for line in proc.stderr:
        if "checkpoint:" in line:
            seen += 1
            if seen == n_checkpoints:
                proc.send_signal(sig)
                break
    rest = proc.stderr.read()
    return proc.wait(timeout=120), rest


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_capture_resumes_to_identical_files(setup, reference, tmp_path, sig):
    out = tmp_path / "acts"
    rc, err = kill_after_checkpoints(command(setup, out), sig)
    if sig == signal.SIGTERM:
        assert rc == EXIT_CHECKPOINTED, err  # checkpointed, not crashed
        assert "SIGTERM: progress saved" in err
    else:
        assert rc == -signal.SIGKILL
    for path in outputs(out):
        assert not path.exists() and partial_path(path).exists()
        with pytest.raises(ActivationFileError):
            open_activations(partial_path(path))
    done = subprocess.run(command(setup, out), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "resuming at context" in done.stderr  # picked up the partial, did not start over
    for path, ref in zip(outputs(out), outputs(reference), strict=True):
        assert not partial_path(path).exists()
        with h5py.File(path, "r") as f, h5py.File(ref, "r") as g:
            assert f["acts"][:].tobytes() == g["acts"][:].tobytes()
            assert f["tokens"][:].tobytes() == g["tokens"][:].tobytes()
            assert dict(f.attrs) == dict(g.attrs)
