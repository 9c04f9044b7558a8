"""Weights checked for NaN and infinite values (inputs.nonfinite): every floating dtype a
safetensors file stores, read a chunk at a time, counted against torch's own isnan and isinf."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from circuitflow import inputs
from circuitflow.errors import ConfigError
from circuitflow.model import checkpoint
from circuitflow.sae import cross_layer_files

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e5m2,
          torch.float8_e4m3fn]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nonfinite_counts_what_torch_counts_across_chunks(dtype, tmp_path, monkeypatch):
    """Values spread over many chunks (a chunk of 64 bytes), after a finite tensor and an
    integer one: the first bad tensor in the file's order, with torch's counts."""
    monkeypatch.setattr(inputs, "FINITE_CHUNK_BYTES", 64)
    gen = torch.Generator().manual_seed(0)
    bad = torch.randn(37, 11, generator=gen)
    bad.view(-1)[[0, 100, 406]] = float("nan")
    if dtype != torch.float8_e4m3fn:  # it has no infinity
        bad.view(-1)[[5, 300]] = float("inf")
        bad.view(-1)[200] = float("-inf")
    tensors = {
        "a.finite": torch.randn(50, generator=gen).to(dtype),
        "b.ids": torch.arange(9),
        "c.bad": bad.to(dtype),
        "d.worse": torch.full((4,), float("nan")).to(dtype),
    }
    save_file(tensors, tmp_path / "w.safetensors")
    want = tensors["c.bad"].float()
    nan, inf = int(want.isnan().sum()), int(want.isinf().sum())
    assert (nan, inf) == ((3, 3) if dtype != torch.float8_e4m3fn else (3, 0))
    assert inputs.nonfinite(tmp_path / "w.safetensors") == ("c.bad", nan, inf)
    skipped = inputs.nonfinite(tmp_path / "w.safetensors", skip=lambda name: name == "c.bad")
    assert skipped == ("d.worse", 4, 0)
    save_file({"a": tensors["a.finite"]}, tmp_path / "ok.safetensors")
    assert inputs.nonfinite(tmp_path / "ok.safetensors") is None


def test_a_truncated_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    truncated = r"w\.safetensors: not a readable safetensors file \(tensor 'w' runs past the end"
    with pytest.raises(inputs.InputError, match=truncated):
        inputs.nonfinite(path)
    # the checkpoint shapes and the cross-layer files read the same header
    with pytest.raises(ConfigError, match=truncated):
        checkpoint.weight_shapes(path)
    with pytest.raises(inputs.InputError, match=truncated):
        cross_layer_files.header(path)
