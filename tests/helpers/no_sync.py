"""A proof, on CPU, that code would not make the host wait for the GPU: `NoHostSync` fails on
the first aten op that reads a device value back to the host on CUDA.

    with NoHostSync():
        step()                      # HostSync: aten.nonzero.default ... would synchronise

It is a TorchDispatchMode, so it sees every op below autograd (forward and backward) whatever
the device, and judges each by what its CUDA kernel does. The ops (SYNC_OPS, and the argument
checks in `why_it_syncs`) are the ones whose CUDA kernels size their output by a device value
or return a Python value: `.item()`, `int(t)`, `float(t)`, `bool(t)` and `if t:` (all
aten._local_scalar_dense), nonzero / argwhere / where(mask), masked_select, unique, boolean-mask
indexing and assignment, bincount (CUDA reads the maximum back to size its output, whatever
`minlength`), histc without a range, repeat_interleave with a tensor of repeats and no
`output_size`, coalescing or converting to a sparse layout, torch.equal, and a tensor built from
Python data (torch.tensor, as_tensor, new_tensor: on the device a blocking host-to-device copy;
a 0-dim one, as `t[mask] = 0` wraps its number, goes to kernels as a scalar and passes).

What it cannot see on CPU: copies between host and device (`.cpu()`, `.to("cuda")`, `.numpy()`,
`.tolist()` are no ops, or no copies, when everything is on the CPU), explicit
`torch.cuda.synchronize()`, and which tensors a CUDA run keeps on the host (SAELens's Adam reads
its step counts, CPU tensors there, with `.item()`: flagged here, no sync there);
`torch.cuda.set_sync_debug_mode("error")` on a GPU settles those.

`allow_reads_of`: host tensors the code reads on purpose (a lagged copy of a device value,
filled by a non-blocking copy), whose `.item()` is a read of host memory, not a sync.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops whose CUDA kernel synchronises whatever their arguments: name -> why.
SYNC_OPS = {
    aten._local_scalar_dense.default: "reads a value back (.item(), int(), float(), bool(), if t)",
    aten.nonzero.default: "sizes its output by the count of nonzero entries",
    aten.masked_select.default: "sizes its output by the count of true entries",
    aten.bincount.default: "reads the input's maximum back to size its output",
    aten._unique.default: "sizes its output by the count of distinct values",
    aten._unique2.default: "sizes its output by the count of distinct values",
    aten.unique_dim.default: "sizes its output by the count of distinct values",
    aten.unique_consecutive.default: "sizes its output by the count of distinct values",
    aten.unique_dim_consecutive.default: "sizes its output by the count of distinct values",
    aten._coalesce.default: "sizes its output by the count of distinct indices",
    aten.equal.default: "returns a Python bool",
    aten.lift_fresh.default: "builds a tensor from Python data (a blocking host-to-device copy)",
}
SPARSE_CONVERSIONS = ("_to_sparse", "to_sparse", "_to_sparse_csr", "_to_sparse_csc",
                      "_to_sparse_bsr", "_to_sparse_bsc")  # fmt: skip
MASK_INDEXING = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}


class HostSync(AssertionError):
    """An op that would make the host wait for the GPU."""


def _is_mask(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def why_it_syncs(func, args: tuple, kwargs: dict) -> str | None:
    """Why `func(*args, **kwargs)` would synchronise on CUDA, or None."""
    if func is aten.lift_fresh.default and args[0].dim() == 0:
        return None
    if func in SYNC_OPS:
        return SYNC_OPS[func]
    if func in MASK_INDEXING and any(_is_mask(i) for i in (args[1] or ())):
        return "boolean-mask indexing (nonzero inside)"
    name = func.overloadpacket.__name__
    if name == "repeat_interleave" and isinstance(args[0], torch.Tensor):
        if kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None):
            if func is aten.repeat_interleave.Tensor or isinstance(args[1], torch.Tensor):
                return "repeats given as a tensor without output_size (sums them on the host)"
    if name == "histc":
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        if lo == hi:
            return "no range given: reads the minimum and maximum back"
    if name in SPARSE_CONVERSIONS:
        return "converts to a sparse layout (counts the nonzero entries)"
    return None


def _caller() -> str:
    """The innermost line outside torch and this file that led to the op: `file:line: code`."""
    skip = (str(Path(torch.__file__).parent), __file__)
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(skip):
            return f"{Path(frame.filename).name}:{frame.lineno}: {frame.line}"
    return "?"


class NoHostSync(TorchDispatchMode):
    """Raise HostSync at the first op that would synchronise on CUDA (`record=True`: collect
    them in `found` instead, as `(op name, why, where)`)."""

    def __init__(self, allow_reads_of: Iterable[torch.Tensor] = (), record: bool = False):
        super().__init__()
        self.allowed = {t.untyped_storage().data_ptr() for t in allow_reads_of}
        self.record = record
        self.found: list[tuple[str, str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = why_it_syncs(func, args, kwargs)
        if why and func is aten._local_scalar_dense.default:
            if args[0].untyped_storage().data_ptr() in self.allowed:
                why = None
        if why:
            where = _caller()
            if not self.record:
                raise HostSync(f"{func} would synchronise with the GPU: {why}, at {where}")
            self.found.append((str(func), why, where))
        return func(*args, **kwargs)
