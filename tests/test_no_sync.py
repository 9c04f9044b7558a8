"""tests/helpers/no_sync.py, the CPU proof of "no host synchronisation" that the SAE step and
attribution's batch loop are run under: it catches each way code reads a device value back, and
lets through the fixed-shape ops that replace them."""

from __future__ import annotations

import pytest
import torch
from helpers.no_sync import HostSync, NoHostSync

x = torch.randn(6, 5)
mask = x > 0
idx = torch.tensor([0, 2, 2])

SYNCS = {
    ".item()": lambda: x.sum().item(),
    "int()": lambda: int(mask.sum()),
    "if tensor": lambda: bool(mask.any()),
    "nonzero": lambda: mask.nonzero(),
    "where(mask)": lambda: torch.where(mask),
    "masked_select": lambda: x.masked_select(mask),
    "boolean index": lambda: x[mask],
    "boolean assignment": lambda: x.clone().__setitem__(mask, 0.0),
    "bincount with minlength": lambda: torch.bincount(idx, minlength=10),
    "unique": lambda: idx.unique(),
    "repeat_interleave of a tensor": lambda: torch.arange(3).repeat_interleave(idx + 1),
    "tensor from a list": lambda: torch.tensor([1.0, 2.0]),
    "boolean assignment of a number": lambda: x.clone().masked_fill(mask, 0).__setitem__(mask, 1),
    "histc without a range": lambda: torch.histc(x),
    "to_sparse": lambda: x.to_sparse(),
    "torch.equal": lambda: torch.equal(x, x),
}
FIXED_SHAPES = {
    "masked_fill": lambda: x.masked_fill(~mask, float("-inf")),
    "where(mask, a, b)": lambda: torch.where(mask, x, 0.0),
    "topk": lambda: x.topk(2, dim=-1, sorted=False),
    "scatter_add counts": lambda: torch.zeros(10).scatter_add_(0, idx, torch.ones(3)),
    "repeat_interleave with output_size": lambda: torch.arange(3).repeat_interleave(
        idx + 1, output_size=7
    ),
    "repeat_interleave of an int": lambda: torch.arange(3).repeat_interleave(2),
    "nonzero_static": lambda: torch.nonzero_static(mask, size=30),
    "histc with a range": lambda: torch.histc(x, bins=4, min=-3, max=3),
    "a number as a 0-dim tensor": lambda: x.clone().__setitem__(0, 0.0),
    "backward": lambda: (x.clone().requires_grad_() ** 2).sum().backward(),
}


@pytest.mark.parametrize("name", SYNCS)
def test_each_read_back_is_caught(name):
    with pytest.raises(HostSync, match="would synchronise with the GPU"), NoHostSync():
        SYNCS[name]()


@pytest.mark.parametrize("name", FIXED_SHAPES)
def test_fixed_shape_ops_pass(name):
    with NoHostSync():
        FIXED_SHAPES[name]()


def test_reads_of_allowed_host_copies_pass_and_record_mode_counts():
    host = torch.empty(1)
    with NoHostSync(allow_reads_of=[host]):
        host.copy_(x.sum(), non_blocking=True)
        host.item()
    with NoHostSync(record=True) as mode:
        x.sum().item()
        mask.nonzero()
    assert [op for op, *_ in mode.found] == ["aten._local_scalar_dense.default",
                                             "aten.nonzero.default"]  # fmt: skip
    assert mode.found[1][2].startswith("test_no_sync.py:")  # where: the line that synced
