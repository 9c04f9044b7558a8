"""Stream shuffled activation batches from a capture-stage HDF5 file (or two in lockstep: a
transcoder's MLP input and output, `PairedActivationStream`).

The stream is a deterministic function of (seed, batch index): epoch ``e`` visits the file's
blocks (contiguous row ranges aligned to HDF5 chunks) in a seeded order, groups of blocks fill a
shuffle buffer, and the buffer's rows are permuted by a generator seeded with (seed, e, group).
Any batch can therefore be rebuilt from its index alone, so resuming needs one integer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import h5py
import numpy as np
import torch

from circuitflow.capture.files import ActivationFileInfo, check_pair
from circuitflow.errors import ActivationFileError


def load_eval_contexts(info: ActivationFileInfo, n_contexts: int) -> torch.Tensor:
    """Rebuild the last ``n_contexts`` model contexts [n, context_length] from ``tokens``."""
    per_ctx = info.context_length - 1 if info.bos_excluded else info.context_length
    total = info.n_tokens // per_ctx
    n = min(n_contexts, total)
    if n < 1:
        raise ActivationFileError(f"{info.path}: fewer tokens than one context")
    with h5py.File(info.path, "r") as f:
        toks = f["tokens"][(total - n) * per_ctx : total * per_ctx]
    ctx = torch.from_numpy(toks.astype(np.int64)).reshape(n, per_ctx)
    if info.bos_excluded:
        bos = torch.full((n, 1), info.bos_token_id, dtype=torch.int64)
        ctx = torch.cat([bos, ctx], dim=1)
    return ctx


@dataclass
class ActivationStreamConfig:
    """How batches are drawn from an activation file."""

    batch_size: int = 4096
    seed: int = 0
    # Rows held in the shuffle buffer; bigger mixes better and costs memory (rows x d_in x 4 B).
    shuffle_buffer_tokens: int = 262_144
    # Batches prepared ahead on a background thread; 0 prepares them in the consumer's thread.
    # None: 4 on CUDA (host work overlaps the GPU), 0 on CPU, where the thread only competes
    # with the training step for cores and the GIL (measured: the prep is ~2% of a step).
    prefetch_batches: int | None = None
    device: str = "cpu"


class ActivationStream:
    """Infinite iterator of float32 [batch_size, d_in] tensors; ``position`` is resumable.

    ``position`` counts batches handed out by ``__next__``; ``ActivationStream(..., position=p)``
    continues the identical sequence from batch ``p``.
    """

    def __init__(
        self, info: ActivationFileInfo, cfg: ActivationStreamConfig, position: int = 0
    ) -> None:
        self.info = info
        self.cfg = cfg
        self.position = position
        n = info.n_tokens
        self._block_rows = max(1, min(info.chunk_rows, n))
        self._n_blocks = -(-n // self._block_rows)
        self._blocks_per_group = max(1, cfg.shuffle_buffer_tokens // self._block_rows)
        self._device = torch.device(cfg.device)
        # Pinned host memory lets the host-to-device copy overlap compute on CUDA.
        self._pin = self._device.type == "cuda"
        prefetch = cfg.prefetch_batches
        if prefetch is None:
            prefetch = 4 if self._device.type == "cuda" else 0
        self._stop = threading.Event()
        self._queue: queue.Queue[torch.Tensor | BaseException] = queue.Queue(
            maxsize=max(1, prefetch)
        )
        self._thread: threading.Thread | None = None
        self._sync: Iterator[torch.Tensor] | None = None
        if prefetch > 0:
            self._thread = threading.Thread(target=self._produce, daemon=True)
            self._thread.start()
        else:
            self._sync = self._batches()

    # --- deterministic layout -------------------------------------------------------------
    def _epoch_groups(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.cfg.seed, epoch])
        order = rng.permutation(self._n_blocks)
        return [
            order[i : i + self._blocks_per_group]
            for i in range(0, self._n_blocks, self._blocks_per_group)
        ]

    def _group_rows(
        self, acts: h5py.Dataset, epoch: int, g: int, blocks: np.ndarray
    ) -> torch.Tensor:
        n = self.info.n_tokens
        sizes = [min(self._block_rows, n - int(b) * self._block_rows) for b in blocks]
        raw = np.empty((sum(sizes), self.info.d_in), dtype=acts.dtype)
        at = 0
        for b, size in zip(blocks, sizes, strict=True):
            start = int(b) * self._block_rows
            acts.read_direct(raw, np.s_[start : start + size], np.s_[at : at + size])
            at += size
        perm = np.random.default_rng([self.cfg.seed, epoch, g, 1]).permutation(len(raw))
        # Permute in the stored dtype, then widen once. index_select + float() takes ~4 ms for
        # 65536 x 64 rows; numpy's astype-then-fancy-index took ~24 ms, torch's t[perm] ~25 ms.
        return torch.from_numpy(raw).index_select(0, torch.from_numpy(perm)).float()

    def _rows_from(self, acts: h5py.Dataset, offset: int):
        """Yield row arrays of the endless stream starting at absolute row ``offset``."""
        n = self.info.n_tokens
        epoch, within = divmod(offset, n)
        while True:
            seen = 0
            for g, blocks in enumerate(self._epoch_groups(epoch)):
                size = sum(min(self._block_rows, n - int(b) * self._block_rows) for b in blocks)
                if seen + size <= within:
                    seen += size
                    continue
                rows = self._group_rows(acts, epoch, g, blocks)
                yield rows[max(0, within - seen) :]
                seen += size
            epoch, within = epoch + 1, 0

    def _batches(self) -> Iterator[torch.Tensor]:
        """The endless batch sequence from ``self.position`` on (float32, maybe pinned)."""
        bs = self.cfg.batch_size
        with h5py.File(self.info.path, "r") as f:
            carry: torch.Tensor | None = None
            for rows in self._rows_from(f["acts"], self.position * bs):
                i = 0
                if carry is not None:
                    # Only the batch straddling two buffer fills is copied; others are views.
                    i = bs - len(carry)
                    if len(rows) < i:
                        carry = torch.cat([carry, rows])
                        continue
                    yield self._finish(torch.cat([carry, rows[:i]]))
                    carry = None
                while len(rows) - i >= bs:
                    yield self._finish(rows[i : i + bs])
                    i += bs
                if i < len(rows):
                    carry = rows[i:]

    def _finish(self, batch: torch.Tensor) -> torch.Tensor:
        return batch.pin_memory() if self._pin else batch

    def _produce(self) -> None:
        try:
            for batch in self._batches():
                if not self._put(batch):
                    return
        except BaseException as exc:  # surfaced to the consumer, never swallowed
            self._queue.put(exc)

    def _put(self, batch: torch.Tensor) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(batch, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    # --- iterator -------------------------------------------------------------------------
    def __iter__(self) -> ActivationStream:
        return self

    def __next__(self) -> torch.Tensor:
        if self._sync is not None:
            try:
                item: torch.Tensor | BaseException = next(self._sync)
            except Exception as exc:
                item = exc
        else:
            item = self._queue.get()
        if isinstance(item, BaseException):
            raise ActivationFileError(f"{self.info.path}: reading activations failed") from item
        self.position += 1
        return item.to(self._device, non_blocking=self._pin)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sync is not None:
            self._sync.close()  # closes the HDF5 file

    def __enter__(self) -> ActivationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PairedActivationStream:
    """ActivationStream's batches of two files read in the same shuffled order (the order is a
    function of the seed and the files' row and chunk counts, which check_pair makes equal),
    concatenated row-wise: [batch, d_in + d_out]. `position` resumes it as it does one file."""

    def __init__(
        self,
        info_in: ActivationFileInfo,
        info_out: ActivationFileInfo,
        cfg: ActivationStreamConfig,
        position: int = 0,
    ) -> None:
        check_pair(info_in, info_out)
        self._streams = (
            ActivationStream(info_in, cfg, position),
            ActivationStream(info_out, cfg, position),
        )

    @property
    def position(self) -> int:
        return self._streams[0].position

    def __iter__(self) -> PairedActivationStream:
        return self

    def __next__(self) -> torch.Tensor:
        return torch.cat([next(s) for s in self._streams], dim=1)

    def close(self) -> None:
        for s in self._streams:
            s.close()
