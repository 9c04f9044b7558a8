"""The capture rules in the real DAG: a dry run, and a sharded run (the shared local Hugging Face
run, conftest's local_hf_results) merged into files that plain h5py reads."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from helpers.dag import load_test_config, run_snakemake

from circuitflow.capture.files import open_activations

pytestmark = pytest.mark.slow
TINY = load_test_config("tiny")


def test_dry_run_lists_one_capture_job(tmp_path):
    config = TINY | {"sites": ["resid_post", "attn_out"]}
    done = run_snakemake(config, tmp_path, "-n", "--quiet", "rules")
    assert "capture_tokens" in done.stdout and "merge_capture" not in done.stdout
    assert any(line.split()[:2] == ["capture", "1"] for line in done.stdout.splitlines())


def test_sharded_capture_runs_and_merges(local_hf_results):
    """Two shards of two sites and layers (conftest's local_hf_results: 3,100 rows of the tiny
    Hugging Face model, d_model 32), merged into files plain h5py reads, the shards deleted."""
    out = local_hf_results / "activations"
    paths = [out / s / f"layer_{n}.h5" for s in ("resid_post", "mlp_out") for n in (0, 1)]
    for path in paths:
        with h5py.File(path, "r") as f:
            assert f["acts"].shape == (3100, 32) and f["acts"].dtype == np.float32
            assert f["tokens"].shape == (3100,) and bool(f.attrs["complete"])
            assert f.attrs["n_shards"] == 1 and f.attrs["context_stop"] == 100
            assert np.isfinite(f["acts"][:]).all()
        open_activations(path).close()
    log = (local_hf_results.parent / "snakemake.log").read_text()
    assert log.count("rule capture_shard:") == 2 and "rule merge_capture:" in log, log[-3000:]
    assert not (out / "shards").exists() or not any((out / "shards").rglob("*.h5"))  # temp()
    assert (out / "tokens.npy").exists()
