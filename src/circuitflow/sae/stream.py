"""Activations streamed from the model inside the SAE job (`sae.source: stream`).

The stream is a deterministic function of (seed, batch index), as the HDF5 stream of `sae.data`
is. Epoch `e` visits the training contexts in an order seeded by (seed, e); consecutive runs of
`buffer_contexts` contexts in that order (a group) fill the shuffle buffer, computed by forward
passes of `batch_contexts` contexts through the deepest hooked layer only (`stop_at_layer`),
every hook of the job captured at once; the buffer's rows are then drawn in an order seeded by
(seed, e, group), so each batch mixes rows of up to `buffer_contexts` contexts. Any batch can
be rebuilt from its index alone: a resumed stream recomputes the one buffer it stopped in (its
forward passes are counted again) and continues the identical sequence. Every hook's batch `i`
holds the same token positions, so the SAEs of a job train in lockstep on the same tokens, and
rows are stored in `capture.dtype` as the capture stage stores them (widened to float32 per
batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from circuitflow import memory
from circuitflow.capture.tokens import stream_salt
from circuitflow.perf import PassCounter

SALT = stream_salt("sae-stream")


@dataclass(frozen=True)
class StreamLayout:
    """Which contexts and rows the stream visits in which order: `n_contexts` training contexts
    of `rows_per_context` rows each (BOS left out where the capture leaves it out), shuffled in
    groups of `buffer_contexts`."""

    n_contexts: int
    rows_per_context: int
    buffer_contexts: int
    seed: int

    @property
    def epoch_rows(self) -> int:
        return self.n_contexts * self.rows_per_context

    @property
    def group_rows(self) -> int:
        return self.buffer_contexts * self.rows_per_context

    @property
    def n_groups(self) -> int:
        return -(-self.n_contexts // self.buffer_contexts)

    def epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, SALT, epoch]).permutation(self.n_contexts)

    def row_order(self, epoch: int, group: int, n_rows: int) -> np.ndarray:
        return np.random.default_rng([self.seed, SALT, epoch, group, 1]).permutation(n_rows)

    def locate(self, row: int) -> tuple[int, int, int]:
        """(epoch, group, rows of that group already drawn) of absolute stream row `row`."""
        epoch, within = divmod(row, self.epoch_rows)
        group, skip = divmod(within, self.group_rows)
        return epoch, group, skip


class ModelActivationStream:
    """Infinite iterator of {hook name: float32 [batch_size, d_in]} from the model's own forward
    passes; `position` counts batches handed out, and `ModelActivationStream(..., position=p)`
    continues the identical sequence from batch `p` (given the same `batch_contexts`: a forward
    pass's batch is part of what fixes its rounding).

    `tokens` is the token set [contexts, context_length] (BOS first), `start` the index of the
    first training context in it; `skip` is 1 where BOS is left out of the rows. A forward pass
    that runs out of CUDA memory is redone at half the contexts (memory.OOMBackoff), which the
    later passes keep. `counter` counts each pass as the fraction `stop_at / n_layers` of a full
    one (perf.PassCounter).
    """

    def __init__(
        self,
        model,
        tokens: np.ndarray,
        hooks: list[str],
        layout: StreamLayout,
        batch_size: int,
        batch_contexts: int,
        stop_at: int,
        *,
        start: int = 0,
        skip: int = 1,
        dtype: str = "float16",
        position: int = 0,
        counter: PassCounter | None = None,
    ) -> None:
        self.model = model
        self.tokens = tokens
        self.hooks = list(hooks)
        self.layout = layout
        self.batch_size = int(batch_size)
        self.stop_at = int(stop_at)
        self.start = start
        self.skip = skip
        self.dtype = dtype
        self.position = position
        self.counter = counter if counter is not None else PassCounter()
        self.device = next(model.parameters()).device
        self.d_in = model.cfg.d_model
        self.contexts_forwarded = 0
        self.backoff = memory.OOMBackoff(batch_contexts, str(self.device), stage="train_sae_stream")
        self._cache: tuple[tuple[int, int], dict[str, torch.Tensor]] | None = None
        self._batches_iter = self._batches()

    @property
    def batch_contexts(self) -> int:
        """Contexts per forward pass now (smaller than planned after an out-of-memory error)."""
        return self.backoff.batch_size

    # --- the buffer -----------------------------------------------------------------------
    def fill(self, contexts: np.ndarray) -> dict[str, torch.Tensor]:
        """Every hook's rows of `contexts` (indices into the training contexts), in that order,
        stored in the stream's dtype on the model's device."""
        r, d = self.layout.rows_per_context, self.d_in
        store = getattr(torch, self.dtype)
        bufs = {
            h: torch.empty((len(contexts) * r, d), dtype=store, device=self.device)
            for h in self.hooks
        }
        span = [0, 0]

        def grab(act: torch.Tensor, hook) -> None:
            stored = act[:, self.skip :].to(store)
            # A bf16 model's activation above 65504 becomes inf in float16; NaNs poison an SAE.
            if not bool(torch.isfinite(stored).all()):
                raise ValueError(
                    f"sae.source stream: {hook.name} has non-finite activations once stored as "
                    f"{self.dtype} (overflow or NaN); use capture.dtype: float32 or "
                    "model.dtype: float32"
                )
            bufs[hook.name][span[0] * r : span[1] * r] = stored.reshape(-1, d)

        def run(a: int, b: int) -> None:
            span[:] = [a, b]
            rows = self.start + contexts[a:b]
            batch = torch.from_numpy(np.asarray(self.tokens[rows], dtype=np.int64))
            with torch.no_grad():
                self.model(batch.to(self.device), stop_at_layer=self.stop_at)
            self.counter.forward(b - a, self.stop_at / self.model.cfg.n_layers)
            self.contexts_forwarded += b - a

        with self.model.hooks(fwd_hooks=[(h, grab) for h in self.hooks]):
            for _ in self.backoff.chunks(len(contexts), run):
                pass
        return bufs

    def _groups(self, row: int) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """(buffer, the order its rows are drawn in) of every group from stream row `row` on;
        the first group's order starts past the rows already drawn."""
        lay = self.layout
        epoch, group, skip = lay.locate(row)
        while True:
            order = lay.epoch_order(epoch)
            for g in range(group, lay.n_groups):
                contexts = order[g * lay.buffer_contexts : (g + 1) * lay.buffer_contexts]
                if self._cache is not None and self._cache[0] == (epoch, g):
                    bufs = self._cache[1]  # after a seek back into the buffer in hand
                else:
                    self._cache = None  # the next buffer is filled without this one alive
                    bufs = self.fill(contexts)
                    self._cache = ((epoch, g), bufs)
                rows = lay.row_order(epoch, g, len(contexts) * lay.rows_per_context)
                yield bufs, torch.from_numpy(rows[skip:]).to(self.device)
                del bufs
                skip = 0
            epoch, group = epoch + 1, 0

    def _take(self, bufs: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {h: bufs[h].index_select(0, idx) for h in self.hooks}

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """The endless batch sequence from `self.position` on."""
        bs = self.batch_size
        carry: dict[str, torch.Tensor] | None = None
        for bufs, idx in self._groups(self.position * bs):
            i = 0
            if carry is not None:
                # Only a batch straddling two buffers is joined from two parts.
                need = bs - len(carry[self.hooks[0]])
                part = self._take(bufs, idx[:need])
                carry = {h: torch.cat([carry[h], part[h]]) for h in self.hooks}
                if len(idx) < need:
                    del bufs
                    continue
                yield {h: t.float() for h, t in carry.items()}
                carry, i = None, need
            while len(idx) - i >= bs:
                yield {h: t.float() for h, t in self._take(bufs, idx[i : i + bs]).items()}
                i += bs
            if i < len(idx):
                carry = self._take(bufs, idx[i:])
            del bufs  # the next buffer is filled without this one alive

    # --- iterator -------------------------------------------------------------------------
    def __iter__(self) -> ModelActivationStream:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = next(self._batches_iter)
        self.position += 1
        return batch

    def seek(self, position: int) -> None:
        """Continue from batch `position` (the buffer in hand is kept if it holds it)."""
        self._batches_iter.close()
        self.position = position
        self._batches_iter = self._batches()

    def close(self) -> None:
        self._batches_iter.close()
        self._cache = None

    def __enter__(self) -> ModelActivationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
