"""The memory planner: estimates, batch-size choice, and OOM back-off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from circuitflow import memory
from circuitflow.attribution import plan as attribution_plan
from circuitflow.sae import plan as sae_plan

CFG = SimpleNamespace(d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=100)


def estimate(**kw):
    args = dict(
        model_cfg=CFG,
        n_params=100_000,
        context_length=32,
        stop_at_layer=2,
        n_captured=2,
        compute_dtype=torch.float32,
        storage_dtype="float16",
        device="cpu",
    )
    return memory.estimate_forward(**(args | kw))


def test_estimate_grows_with_context_captures_and_logits():
    base = estimate()
    assert base.weights == 400_000
    assert estimate(context_length=64).per_context() > 2 * base.per_context() * 0.99
    assert estimate(n_captured=4).per_context() > base.per_context()
    # Stopping before the unembedding saves the logits.
    assert estimate(stop_at_layer=None).per_context() > base.per_context()
    # On CUDA the host-side capture buffers do not count against device memory.
    assert estimate(device="cuda").per_context() < base.per_context()


def test_plan_picks_largest_power_of_two_that_fits():
    est = estimate()
    budget_for_37 = est.total(37)
    plan = memory.plan_batch_size(est, 256, fraction=1.0, available=budget_for_37)
    assert plan.batch_size == 32
    assert plan.estimate_bytes == est.total(32) <= plan.budget_bytes
    assert "batch 32 contexts" in plan.describe()
    # The cap wins when memory is plentiful.
    assert memory.plan_batch_size(est, 8, available=1 << 40).batch_size == 8


def test_plan_refuses_when_one_context_does_not_fit():
    est = estimate()
    with pytest.raises(MemoryError, match="not enough memory on cpu"):
        memory.plan_batch_size(est, 256, fraction=1.0, available=est.total(1) - 1)


def test_available_and_peak_memory_on_cpu():
    assert memory.available_bytes("cpu") > 0
    assert memory.peak_memory_bytes("cpu") > 0


def test_oom_backoff_halves_and_keeps_the_smaller_size():
    tried = []

    def inject(batch_size):
        if batch_size > 8:
            raise torch.cuda.OutOfMemoryError("injected")

    backoff = memory.OOMBackoff(64, "cpu", inject=inject)
    assert backoff.run(lambda bs: tried.append(bs) or bs) == 8
    assert backoff.batch_size == 8
    backoff.run(lambda bs: tried.append(bs))
    assert tried == [8, 8]  # the second batch starts at the smaller size


def test_oom_backoff_fails_clearly_below_batch_size_one():
    def always(batch_size):
        raise torch.cuda.OutOfMemoryError("injected")

    backoff = memory.OOMBackoff(4, "cpu", inject=always)
    with pytest.raises(MemoryError, match="even at batch size 1"):
        backoff.run(lambda bs: bs)


def test_peak_meter_sees_a_block_that_is_freed_again():
    with memory.PeakMeter("cpu") as meter:
        block = torch.ones(64, 1 << 20)  # 256 MiB, touched
        del block
    if not meter.exact:
        pytest.skip("the resident-set peak cannot be reset here")
    assert 250 << 20 <= meter.delta < 400 << 20
    assert memory.current_memory_bytes("cpu") < meter.peak - (200 << 20)


def test_sae_estimate_counts_optimiser_state_and_batch():
    est = sae_plan.estimate_sae_training(
        768, 24576, "topk", "cuda", n_file_rows=1 << 22, shuffle_buffer_rows=1 << 18
    )
    params = sae_plan.sae_param_bytes(768, 24576)
    # Tiny batches are bounded by Adam's step; large ones grow by the per-row activations.
    assert est.total(1) == int(sae_plan.SAE_OPTIMISER_COPIES * params)
    assert est.total(8192) - est.total(4096) == 4096 * est.per_item()
    assert est.per_item() == int((11 * 24576 + 8 * 768) * 4)
    assert (
        sae_plan.estimate_sae_training(768, 24576, "standard", "cuda", 1 << 22, 1 << 18).per_item()
        < est.per_item()
    )
    # On CPU the shuffle buffer lives in the same memory.
    cpu = sae_plan.estimate_sae_training(768, 24576, "topk", "cpu", 1 << 22, 1 << 18)
    assert cpu.total(4096) > est.total(4096)
    # The sparse trainer (sae.fast) holds a few d_sae-wide tensors per row, not eleven; the
    # gpu trainer (sae.stacked) fewer still.
    sparse = sae_plan.estimate_sae_training(
        768, 24576, "topk", "cuda", 1 << 22, 1 << 18, trainer="fast"
    )
    assert sparse.per_item() == int((3.1 * 24576 + 8 * 768) * 4)
    gpu = sae_plan.estimate_sae_training(
        768, 24576, "topk", "cuda", 1 << 22, 1 << 18, trainer="gpu"
    )
    assert gpu.per_item() == int((2.4 * 24576 + 8 * 768) * 4)
    for trainer in ("fast", "gpu"):
        with pytest.raises(ValueError, match=f"sae.trainer {trainer} cannot train this"):
            sae_plan.estimate_sae_training(
                768, 24576, "standard", "cuda", 1 << 22, 1 << 18, trainer=trainer
            )


def test_attribution_estimate_integrated_gradients_holds_what_atp_holds():
    """IG moves every node along its path and takes every node's gradient in one
    forward/backward per step: per prompt it holds what AtP holds (no copy per head)."""
    atp = attribution_plan.estimate_attribution(
        CFG_FULL, 1_000_000, 16, 2, 2048, torch.float32, "cuda", "atp"
    )
    ig = attribution_plan.estimate_attribution(
        CFG_FULL, 1_000_000, 16, 2, 2048, torch.float32, "cuda", "ig"
    )
    assert ig.per_item() == atp.per_item()
    assert ig.fixed() == atp.fixed()
    assert "prompts" in memory.plan_batch_size(atp, 64, available=1 << 40).describe()


CFG_FULL = SimpleNamespace(
    n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=100, act_fn="gelu_new",
    normalization_type="LN", gated_mlp=False,
)  # fmt: skip
