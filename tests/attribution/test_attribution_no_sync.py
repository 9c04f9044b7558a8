"""Attribution's batch loop never makes the host wait for the GPU (issue 46): its steady-state
batches run under helpers.no_sync.NoHostSync, which fails on any op that would read a device
value back on CUDA; the one copy a batch sends to the host (scores.Kept) does not block."""

from __future__ import annotations

import pytest
from helpers.no_sync import HostSync, NoHostSync
from helpers.spliced import tiny_spliced

from circuitflow import memory
from circuitflow.attribution import methods
from circuitflow.attribution import scores as attr
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.splice import Spliced
from circuitflow.batching import selection_half


@pytest.fixture(scope="module")
def tiny():
    return tiny_spliced(10, frozen=True)


def run_loop(tiny, method: str):
    """The fast pass over 10 prompts in batches of 3 (4 batches, validation rows in 3)."""
    model, saes, prompts = tiny
    cfg = AttributionConfig(method=method, ig_steps=2, batch_size=3, validation_prompts=5)
    sp = Spliced.of(model, saes)
    backoff = memory.OOMBackoff(cfg.batch_size, "cpu")
    checked = attr.validation_mask(prompts, cfg)
    return attr.fast_pass(sp, prompts, cfg, backoff, selection_half(prompts), checked)


@pytest.mark.parametrize("method", list(methods.REGISTRY))
def test_fast_pass_reads_nothing_back(tiny, method):
    run_loop(tiny, method)  # the first pass: lazy initialisation is not the steady state
    with NoHostSync():
        fast, _, kept, _ = run_loop(tiny, method)
    assert fast.n[None] == 10 and len(kept.labels) == 5  # the loop ran and kept its rows


def test_one_item_put_back_is_caught(tiny, monkeypatch):
    """The check's control: the metric's sum read back once a batch, as the loop did before."""
    change = attr.activation_change

    def reading(sp, clean, corr):
        out = change(sp, clean, corr)
        float(next(iter(out.values())).sum().item())
        return out

    monkeypatch.setattr(attr, "activation_change", reading)
    with pytest.raises(HostSync, match="_local_scalar_dense"), NoHostSync():
        run_loop(tiny, "atp")
