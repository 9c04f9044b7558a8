"""The memory planner against measured peaks: each stage's real work on CPU (capture with
TransformerLens and the HDF5 writer, SAE training with the fast trainer and SAELens's,
attribution with spliced SAEs, both real architectures at 2 layers), measured in a fresh process
by tests/helpers/memory_probe.py, must come within 20% of the planner's estimate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).parent / "helpers" / "memory_probe.py"
CASES = {
    ("capture", "gpt2-small"),
    ("capture", "qwen2.5-0.5b"),
    ("sae_train", "topk"),  # the fast trainer, as the stage runs it
    ("sae_train", "batchtopk"),
    ("sae_train", "topk saelens"),
    ("sae_train", "standard"),
    ("attribution", "gpt2-small atp"),
    ("attribution", "qwen2.5-0.5b atp"),
    ("attribution", "gpt2-small ig"),
}


@pytest.fixture(scope="module")
def measured():
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the resident-set peak")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run(
        [sys.executable, str(PROBE)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if any("skip" in r for r in records):
        pytest.skip(records[0]["skip"])
    return {(r["stage"], r["case"]): r for r in records}


def test_every_stage_was_measured(measured):
    assert set(measured) == CASES
    for r in measured.values():
        # Large enough that tensors, not allocator noise, make the peak.
        assert r["measured"] > 100 * 2**20, r


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def test_estimate_within_20_percent_of_measured_peak(measured, case):
    r = measured[case]
    ratio = r["planned"] / r["measured"]
    assert 0.8 <= ratio <= 1.2, (
        f"{case}: planned {r['planned'] / 2**20:.0f} MiB, "
        f"measured {r['measured'] / 2**20:.0f} MiB (ratio {ratio:.2f})"
    )
