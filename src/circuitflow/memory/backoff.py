"""Out-of-memory back-off: run batches, halving the batch size on a CUDA out-of-memory error,
and the fault injection the tests use to raise one on a machine without a GPU."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")


def free_device_memory(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


INJECT_OOM_ENV = "CIRCUITFLOW_INJECT_OOM"


def injected_oom(stage: str) -> Callable[[int], None] | None:
    """Test hook (fault injection on a machine without a GPU): with
    CIRCUITFLOW_INJECT_OOM="capture,train_sae:3" a CUDA-style OutOfMemoryError is raised once in
    each named stage, at its n-th batch tried (default the first), before the batch runs. None
    when the variable does not name `stage`."""
    for item in filter(None, os.environ.get(INJECT_OOM_ENV, "").split(",")):
        name, _, nth = item.strip().partition(":")
        if name == stage:
            return _raise_oom_at(stage, int(nth or 1))
    return None


def _raise_oom_at(stage: str, at: int) -> Callable[[int], None]:
    tries = [0]

    def inject(batch_size: int) -> None:
        tries[0] += 1
        if tries[0] == at:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (injected by {INJECT_OOM_ENV} into {stage}, "
                f"batch size {batch_size})"
            )

    return inject


class OOMBackoff:
    """Run batches, halving the batch size on CUDA out-of-memory and keeping the smaller size.

    `run(fn)` calls `fn(batch_size)` until it succeeds; each OOM frees the cache and halves the
    size. Below 1 it raises MemoryError with a clear message. `inject` is a test hook: called with
    the batch size before each try, it may raise OutOfMemoryError itself; by default it is the
    CIRCUITFLOW_INJECT_OOM hook of `stage` (`injected_oom`). The one place every GPU stage
    (capture, train_sae, attribution, interventions) forms its batches through.
    """

    def __init__(
        self,
        batch_size: int,
        device: str,
        inject: Callable[[int], None] | None = None,
        on_change: Callable[[int], None] | None = None,
        stage: str | None = None,
    ):
        self.batch_size = batch_size
        self.device = str(device)
        self.inject = inject if inject is not None or stage is None else injected_oom(stage)
        self.on_change = on_change
        self.stage = stage or "batch"
        self.halvings = 0

    def run(self, fn: Callable[[int], object]):
        while True:
            try:
                if self.inject is not None:
                    self.inject(self.batch_size)
                return fn(self.batch_size)
            except torch.cuda.OutOfMemoryError:
                free_device_memory(self.device)
                if self.batch_size <= 1:
                    raise MemoryError(
                        f"out of memory on {self.device} even at batch size 1; "
                        "use a larger device, a smaller dtype or a shorter context"
                    ) from None
                self.batch_size //= 2
                self.halvings += 1
                log.warning(
                    "%s: out of memory: batch size halved to %d", self.stage, self.batch_size
                )
                if self.on_change is not None:
                    self.on_change(self.batch_size)

    def chunks(self, n: int, fn: Callable[[int, int], T]) -> Iterator[T]:
        """`fn(start, stop)` over items [0, n) in chunks of at most `batch_size`, yielding each
        result. A chunk that runs out of memory is redone at half the size, which later chunks
        keep. `fn` must leave no lasting effect until it returns: callers accumulate what it
        returns, so a failed try is never counted."""
        start = 0
        while start < n:

            def attempt(size: int, start: int = start) -> tuple[int, T]:
                stop = min(start + size, n)
                return stop, fn(start, stop)

            start, out = self.run(attempt)
            yield out
