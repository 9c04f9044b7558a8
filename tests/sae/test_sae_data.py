"""The HDF5 activation stream: contract checks, determinism, resumability, eval contexts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.sae_data import BOS, CONTEXT_LENGTH, contexts, tiny_model, write_capture

from circuitflow.capture.files import read_activation_info
from circuitflow.errors import ActivationFileError
from circuitflow.sae.data import ActivationStream, ActivationStreamConfig, load_eval_contexts

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    return write_capture(tiny_model(), tmp_path_factory.mktemp("d") / "layer_0.h5", n_contexts=64)


def test_incomplete_file_is_rejected_naming_it(tmp_path):
    path = write_capture(tiny_model(), tmp_path / "layer_0.h5", n_contexts=4, complete=False)
    with pytest.raises(ActivationFileError, match=r"layer_0\.h5.*incomplete"):
        read_activation_info(path)


def test_stream_is_a_seeded_permutation_and_resumes_exactly(capture):
    info = read_activation_info(capture)
    assert (info.n_tokens, info.d_in, info.chunk_rows) == (64 * (CONTEXT_LENGTH - 1), 32, 512)
    # A shuffle buffer of two chunks: rows are mixed across chunks but not globally.
    cfg = ActivationStreamConfig(batch_size=256, seed=3, shuffle_buffer_tokens=1024)
    n_per_epoch = info.n_tokens // 256
    with ActivationStream(info, cfg) as s:
        batches = [next(s) for _ in range(n_per_epoch + 3)]
        assert s.position == n_per_epoch + 3
    epoch = torch.cat(batches[:n_per_epoch])
    import h5py

    with h5py.File(capture) as f:
        raw = torch.from_numpy(f["acts"][:].astype(np.float32))
    # Every row of the file exactly once per epoch, in a different order.
    assert torch.equal(epoch.sort(dim=0).values, raw.sort(dim=0).values)
    assert not torch.equal(epoch, raw)
    # Resuming at position p replays batches p, p+1, ... bit for bit, across the epoch boundary.
    with ActivationStream(info, cfg, position=n_per_epoch - 1) as s:
        for b in batches[n_per_epoch - 1 :]:
            assert torch.equal(next(s), b)
    # Another seed, another order.
    with ActivationStream(info, ActivationStreamConfig(batch_size=256, seed=4)) as s:
        assert not torch.equal(next(s), batches[0])


def test_eval_contexts_rebuild_model_inputs_with_bos(capture):
    info = read_activation_info(capture)
    ctx = load_eval_contexts(info, 5)
    assert ctx.shape == (5, CONTEXT_LENGTH)
    assert torch.equal(ctx, contexts(64)[-5:])
    assert (ctx[:, 0] == BOS).all()
