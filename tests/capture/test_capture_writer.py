"""capture/writer.py: the thread that writes a batch's rows while the next batch runs checks
each hook's rows for non-finite values first (on the device, read once a batch) and reports
the first such hook by name, writing none of that batch's rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitflow.capture.files import PartialFile
from circuitflow.capture.writer import BatchWriter

D, ROWS = 4, 6


def test_a_non_finite_batch_is_refused_naming_its_hook_and_not_written(tmp_path):
    files = [PartialFile("resid_post", n, tmp_path / f"layer_{n}.h5", D) for n in (0, 1)]
    for f in files:
        f.open("key", 2 * ROWS, "float16")
    good = 1 + torch.arange(ROWS * D, dtype=torch.float32).reshape(2, ROWS // 2, D)
    bad = good.clone()
    bad[1, 0, 2] = 1e6  # beyond float16's range: inf once stored
    try:
        with BatchWriter(files, ROWS, D, "float16", "cpu") as writer:
            for r0, rows in ((0, (good, good)), (ROWS, (good, bad))):
                slot = writer.slot()
                for i, x in enumerate(rows):
                    slot.take(i, x.to(torch.float16))
                writer.submit(slot, r0, r0 + ROWS)
            with pytest.raises(ValueError, match=r"blocks\.1\.hook_resid_post has non-finite"):
                writer.drain()
        for f in files:
            acts = f.file["acts"][:]
            np.testing.assert_array_equal(acts[:ROWS], good.reshape(-1, D).numpy())
            assert (acts[ROWS:] != good.reshape(-1, D).numpy()).all()  # never written
    finally:
        for f in files:
            f.close()
