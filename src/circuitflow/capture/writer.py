"""The capture's writes, overlapped with its next forward pass.

A batch's activations go from the forward's hooks into a slot of host memory (pinned on a GPU,
filled by copies that do not block the host), and a writer thread puts each slot's rows into
the HDF5 files while the next batch runs. Two slots: the forward fills one while the thread
writes the other, and waits only when the thread is a whole batch behind (the disk is the
bottleneck). Each hook's rows are checked for non-finite values on the device, and the
thread reads the flags once a batch, after the batch's copies are done: an overflow is
reported before any of its batch's rows are written.

The rows are the same and land at the same places as when the forward wrote them itself, so
the files are the same bytes (tests/capture/test_capture_stage.py).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from circuitflow.capture.files import PartialFile
from circuitflow.capture.plan import HOST_BATCHES as SLOTS
from circuitflow.devices import host_tensor


@dataclass
class Slot:
    """One batch's rows on the host: `acts` [hooks, rows, d] in the storage dtype and each
    hook's finite flag, on the device (`finite`, set by the hooks) and on the host (`flags`)."""

    acts: torch.Tensor
    finite: torch.Tensor
    flags: torch.Tensor
    done: torch.cuda.Event | None = field(default=None, repr=False)

    def take(self, i: int, stored: torch.Tensor) -> None:
        """Hook `i`'s stored rows [b, positions, d]: flagged and copied without blocking."""
        self.finite[i] = torch.isfinite(stored).all()
        n = stored.shape[0] * stored.shape[1]
        self.acts[i, :n].view(stored.shape).copy_(stored, non_blocking=True)


class BatchWriter:
    """Writes batches' rows into `files` (PartialFile, in the slots' hook order) from a thread.
    `rows`: a batch's rows at most; `dtype`: the storage dtype's name. Use as a context
    manager; `slot()`, fill it in the forward's hooks, `submit()`; `drain()` before a
    checkpoint. The thread's error (a non-finite batch, a failed write) is raised in the
    caller at its next `slot`, `submit` or `drain`, and stops the writes."""

    def __init__(self, files: list[PartialFile], rows: int, d: int, dtype: str, device: str):
        self.files, self.device = files, str(device)
        self.cuda = self.device.startswith("cuda")
        store = getattr(torch, dtype)
        self.free: queue.Queue[Slot] = queue.Queue()
        for _ in range(SLOTS):
            self.free.put(
                Slot(
                    host_tensor((len(files), rows, d), store, self.device),
                    torch.ones(len(files), dtype=torch.bool, device=self.device),
                    host_tensor((len(files),), torch.bool, self.device),
                )
            )
        self.work: queue.Queue[tuple[Slot, int, int, int] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.dtype = dtype
        self.thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
        self.thread.start()

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.work.put(None)
        self.thread.join()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def slot(self) -> Slot:
        """A free slot (waiting while the thread still writes both)."""
        self._check()
        slot = self.free.get()
        self._check()
        slot.finite.fill_(True)
        return slot

    def release(self, slot: Slot) -> None:
        """Give back a slot whose batch was not submitted (it ran out of memory)."""
        self.free.put(slot)

    def submit(self, slot: Slot, r0: int, r1: int) -> None:
        """The slot's first r1 - r0 rows of every hook go to rows r0:r1 of the files, once the
        device has copied them."""
        slot.flags.copy_(slot.finite, non_blocking=True)
        if self.cuda:
            slot.done = torch.cuda.Event()
            slot.done.record()
        self.work.put((slot, r0, r1, r1 - r0))
        self._check()

    def drain(self) -> None:
        """Wait until every submitted batch is written."""
        self.work.join()
        self._check()

    def _run(self) -> None:
        while (job := self.work.get()) is not None:
            slot, r0, r1, n = job
            try:
                if self.error is None:
                    self._write(slot, r0, r1, n)
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
                self.error = err
            finally:
                self.free.put(slot)
                self.work.task_done()
        self.work.task_done()

    def _write(self, slot: Slot, r0: int, r1: int, n: int) -> None:
        if slot.done is not None:
            slot.done.synchronize()
        bad = np.flatnonzero(~slot.flags.numpy())
        if len(bad):
            f = self.files[int(bad[0])]
            raise ValueError(
                f"capture: {f.hook} has non-finite activations once stored as {self.dtype} "
                "(overflow or NaN); use capture.dtype: float32 or model.dtype: float32"
            )
        for i, f in enumerate(self.files):
            f.file["acts"][r0:r1] = slot.acts[i, :n].numpy()
