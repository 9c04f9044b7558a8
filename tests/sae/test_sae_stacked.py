"""The gpu trainer (sae.stacked): its step against SAELens's (float32 and bf16), exact AuxK
skipping, no host synchronisation in a steady-state step (tests/helpers/no_sync.py), and
`sae.trainer: auto` choosing by measured rates. Several SAEs as one against each alone:
tests/sae/test_sae_stream.py; whole training runs against SAELens's: tests/sae/test_sae_fast.py."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from helpers.no_sync import HostSync, NoHostSync
from helpers.sae_data import D_IN, D_SAE, perturbed_sae, saelens_step
from tqdm import tqdm

from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.stacked import PARAMS, Stack, StepSpec, forward_backward
from circuitflow.sae.trainer import trainer_config
from circuitflow.sae.trainer_choice import Choice, pick, resumed
from circuitflow.sae.trainers import build_group

torch.set_num_threads(1)
MLP_OUT = "blocks.0.hook_mlp_out"


def our_step(sae, x: torch.Tensor, dead: torch.Tensor, autocast: bool = False):
    """The stacked step of `sae` alone (a one-member stack) on SAELens's inputs."""
    weights = [getattr(sae, p).detach().unsqueeze(0) for p in PARAMS]
    x_in, target = (x[:, :D_IN], x[:, D_IN:]) if x.shape[1] > D_IN else (x, x)
    spec = StepSpec.of(sae, autocast)
    return forward_backward(weights, x_in[None], target[None], dead[None] if dead.any() else None,
                            spec)  # fmt: skip


def batch_and_dead(n_dead: int, width: int = D_IN):
    g = torch.Generator().manual_seed(1)
    x = 2 * torch.randn(64, width, generator=g)
    dead = torch.zeros(D_SAE, dtype=torch.bool)
    dead[torch.randperm(D_SAE, generator=g)[:n_dead]] = True
    return x, dead


@pytest.mark.parametrize(
    ("architecture", "n_dead", "bias", "hook_out"),
    [
        ("topk", 0, 0.0, ""),  # AuxK off
        ("topk", 5, -10.0, ""),  # scaled down (5 < 16 dead); TopK picks negative pre-activations
        ("topk", 100, 0.0, ""),  # AuxK in full
        ("batchtopk", 5, 0.0, ""),
        ("batchtopk", 100, -10.0, ""),
        ("topk", 100, 0.0, MLP_OUT),  # a transcoder: [input | target] rows, no b_dec on input
    ],
)
def test_losses_and_gradients_equal_saelens(architecture, n_dead, bias, hook_out):
    ours = perturbed_sae(architecture, hook_out=hook_out)
    with torch.no_grad():
        ours.b_enc.add_(bias)
    ref = copy.deepcopy(ours)
    x, dead = batch_and_dead(n_dead, 2 * D_IN if hook_out else D_IN)

    expected = saelens_step(ref, x, dead)
    got = our_step(ours, x, dead)

    # bias -10: fewer positive pre-activations than picks, so some picks do not fire
    assert (got.acts == 0).any() == (bias < 0)
    torch.testing.assert_close(got.mse[0], expected.losses["mse_loss"], rtol=1e-5, atol=1e-6)
    aux = expected.losses["auxiliary_reconstruction_loss"]
    torch.testing.assert_close(got.aux[0], aux, rtol=1e-5, atol=1e-6)
    assert (aux > 0) == (n_dead > 0)
    torch.testing.assert_close(got.sae_out[0], expected.sae_out, rtol=1e-5, atol=1e-5)
    acts = torch.zeros(64, D_SAE)  # SAELens's dense feature_acts from our entries
    acts[got.tokens[0], got.latents[0]] = got.acts[0]
    torch.testing.assert_close(acts, expected.feature_acts, rtol=1e-5, atol=1e-6)
    for name, grad in zip(PARAMS, got.grads, strict=True):
        want = getattr(ref, name).grad
        assert want.abs().max() > 0, name
        scale = want.abs().max().item()
        torch.testing.assert_close(grad[0], want, rtol=1e-4, atol=1e-6 * scale, msg=name)


@pytest.mark.parametrize("architecture", ["topk", "batchtopk"])
def test_bf16_step_equals_saelens_autocast_step(architecture):
    """Under sae.autocast the dense products run in bf16 (float32 weights, losses, sums): the
    same losses as SAELens's autocast step, gradients within 1% of their largest entry (both
    round the products' outputs to bf16, in different orders); float32 differs by ~2%."""
    ours = perturbed_sae(architecture)
    ref, exact = copy.deepcopy(ours), copy.deepcopy(ours)
    x, dead = batch_and_dead(40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = saelens_step(ref, x, dead)
    saelens_step(exact, x, dead)
    got = our_step(ours, x, dead, autocast=True)
    assert got.mse.dtype == got.grads[0].dtype == torch.float32
    torch.testing.assert_close(got.mse[0], expected.losses["mse_loss"], rtol=1e-4, atol=0)
    aux = expected.losses["auxiliary_reconstruction_loss"]
    torch.testing.assert_close(got.aux[0], aux, rtol=1e-4, atol=0)
    for name, grad in zip(PARAMS, got.grads, strict=True):
        want = getattr(ref, name).grad
        scale = want.abs().max().item()
        torch.testing.assert_close(grad[0], want, rtol=0, atol=0.01 * scale, msg=name)
    # It did run in bf16: float32's W_enc gradient is ten times further away.
    fp32 = exact.W_enc.grad
    assert (got.grads[0][0] - fp32).abs().max() > 0.01 * fp32.abs().max()
    assert got.grads[0][0].dtype == torch.float32  # master weights' gradients stay float32


# --- training steps -----------------------------------------------------------------------------
def stack_trainers(window: int, n: int = 1, architecture: str = "topk", skip_aux: bool = True):
    """`n` gpu trainers of SAEs of one shape, stacked as a streaming job's are, with latents
    dead after `window` silent steps (k = 1 of 256 latents: most die)."""
    cfg = SAETrainConfig(architecture=architecture, k=1, d_sae=D_SAE, batch_size=64,
                         total_tokens=64 * 100, trainer="gpu")  # fmt: skip
    tcfg = trainer_config(cfg, SimpleNamespace(n_tokens=10**6), "cpu")
    tcfg = dataclasses.replace(tcfg, dead_feature_window=window)
    saes = [perturbed_sae(architecture, seed=i) for i in range(n)]
    trainers = build_group(cfg, tcfg, saes, [None] * n, Choice("gpu", "test", ""))
    trainers[0].stack.skip_aux = skip_aux
    return trainers


def batches(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(64, D_IN, generator=g) for _ in range(n)]


def loop(trainers, data: list[torch.Tensor]) -> None:
    """SAELens's training loop body (SAETrainer.fit / MultiSAETrainer.fit): every member's
    step on its batch, the step counters, the progress bar (every 100 steps)."""
    bar = tqdm(disable=True)
    for batch in data:
        for i, tr in enumerate(trainers):
            tr.maybe_reset_sparsity()
            out = tr.step(batch * (i + 1))
        for tr in trainers:
            tr.n_training_steps += 1
            tr._update_pbar(out, bar, update_interval=2)


@pytest.mark.parametrize("window", [3, 1000])  # AuxK on from step 4; never
def test_skipping_auxk_while_nothing_can_be_dead_changes_nothing(window):
    """The lagged proof skips AuxK only while no latent can be dead; with it and without it
    (AuxK's zero terms computed) the weights, Adam state and statistics are identical."""
    runs = []
    for skip in (True, False):
        (tr,) = stack_trainers(window, skip_aux=skip)
        skipped = []
        for batch in batches(8):
            skipped.append(tr.stack.dead_or_none() is None)
            loop([tr], [batch])
        runs.append((tr, skipped))
    (ours, skipped), (ref, _) = runs
    assert skipped == [True] * 4 + [False] * 4 if window == 3 else all(skipped)
    assert int(ref.dead_neurons.sum()) > 0 if window == 3 else int(ref.dead_neurons.sum()) == 0
    for a, b in zip(ours.stack.params, ref.stack.params, strict=True):
        assert torch.equal(a, b)
        state, other = ours.stack.optimizer.state[a], ref.stack.optimizer.state[b]
        assert all(torch.equal(state[k], other[k]) for k in state)
    assert torch.equal(ours.n_forward_passes_since_fired, ref.n_forward_passes_since_fired)


def test_a_stacked_transcoder_reads_its_input_and_predicts_its_target():
    """A transcoder's [input | target] rows through a stack member's step (SAELens's step
    seam): the losses SAELens's transcoder step computes on the same weights and rows."""
    cfg = SAETrainConfig(k=8, d_sae=D_SAE, batch_size=64, total_tokens=6400, kind="transcoder")
    tcfg = trainer_config(cfg, SimpleNamespace(n_tokens=10**6), "cpu")
    ours = perturbed_sae("topk", hook_out=MLP_OUT)
    ref = copy.deepcopy(ours)
    (tr,) = build_group(cfg, tcfg, [ours], [None], Choice("gpu", "test", ""))
    x, dead = batch_and_dead(0, 2 * D_IN)
    expected = saelens_step(ref, x, dead)
    got = tr.step(x)
    for name in ("mse_loss", "auxiliary_reconstruction_loss"):
        torch.testing.assert_close(got.losses[name], expected.losses[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.sae_out, expected.sae_out, rtol=1e-5, atol=1e-5)


class Halves:
    """memory.OOMBackoff after one out-of-memory error: the step in two halves."""

    def run(self, attempt):
        return attempt(32)


def test_a_step_redone_in_halves_is_the_same_step():
    """After an out-of-memory error the stack redoes the step over micro-batches: gradients
    and losses summed (each part's already over the whole batch), firing statistics over every
    row: TopK's step is the same. (BatchTopK picks and moves its threshold per half, as
    SAELens's accumulated step does: another step.)"""
    whole, halves = (stack_trainers(3, n=2)[0].stack for _ in "ab")
    data = batches(5)
    for stack, backoff in ((whole, None), (halves, Halves())):
        for batch in data:
            stack.submit(0, batch)
            stack.submit(1, 2 * batch)
            stack.run(backoff or stack_backoff())
    for a, b in zip(whole.params, halves.params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert torch.equal(whole.since_fired, halves.since_fired)
    assert torch.equal(whole.act_freq, halves.act_freq)
    assert (whole.since_fired > 3).any()  # AuxK was on in the last steps


def stack_backoff():
    from circuitflow.memory import OOMBackoff

    return OOMBackoff(64, "cpu", stage="train_sae")


def with_item_put_back(self: Stack):
    """SAELens's AuxK check, `int(dead.sum()) == 0`, put back into the stack."""
    dead = self.since_fired > self.window
    return None if int(dead.sum()) == 0 else dead


@pytest.mark.parametrize("architecture", ["topk", "batchtopk"])
@pytest.mark.parametrize("window", [2, 1000])  # AuxK on in the steps checked; skipped
@pytest.mark.parametrize("sync", [False, True])  # True: one .item() put back: it must fail
def test_a_steady_state_step_never_waits_for_the_device(architecture, window, sync, monkeypatch):
    """Steady-state steps of a two-member stack, through SAELens's loop seams (step, counters,
    progress bar), under NoHostSync: no op that reads a device value back on CUDA."""
    trainers = stack_trainers(window, n=2, architecture=architecture)
    data = batches(6)
    loop(trainers, data[:3])  # warm-up: latents die (window 2), the lagged reading lands
    assert (trainers[0].stack.dead_or_none() is None) == (window == 1000)
    if sync:
        monkeypatch.setattr(Stack, "dead_or_none", with_item_put_back)
    try:
        with NoHostSync():
            loop(trainers, data[3:])
    except HostSync as err:
        assert sync, err
        assert "aten._local_scalar_dense" in str(err)
    else:
        assert not sync, "the .item() put back was not caught"


@pytest.mark.parametrize(("trainer", "per_step"), [("fast", 7), ("saelens", 2)])
def test_the_other_trainers_steps_read_back(trainer, per_step):
    """The proof's other side: sae.fast's step reads device values back 7 times (int(dead.sum()),
    nonzero, two bincounts, a tensor from a list, boolean-mask indexing and assignment),
    SAELens's twice (int(dead.sum()), a boolean-mask assignment; its Adam's step-count reads
    are of host tensors on CUDA, not counted)."""
    cfg = SAETrainConfig(k=1, d_sae=D_SAE, batch_size=64, total_tokens=6400, trainer=trainer)
    tcfg = dataclasses.replace(
        trainer_config(cfg, SimpleNamespace(n_tokens=10**6), "cpu"), dead_feature_window=2
    )
    (tr,) = build_group(cfg, tcfg, [perturbed_sae("topk")], [None], Choice(trainer, "test", ""))
    data = batches(5)
    loop([tr], data[:3])
    with NoHostSync(record=True) as mode:
        for batch in data[3:]:
            tr.step(batch)
    syncs = [op for op, _, where in mode.found if "optimizer.step()" not in where]
    assert len(syncs) == 2 * per_step, mode.found


# --- sae.trainer: auto ----------------------------------------------------------------------------
def measured(kind: str, name: str | None, created: str, **rates: float) -> dict:
    return {"type": kind, "gpu": name, "file": f"sae_train-{name or kind}.json",
            "created": created, "rates": rates}  # fmt: skip


RESULTS = [
    measured("cpu", None, "2026-11-23", fast=170.0, gpu=60.0, saelens=36.0),
    measured("cuda", "NVIDIA H200", "2026-11-27", fast=215_000.0, saelens=269_000.0),
    measured("cuda", "NVIDIA H200", "2026-12-01", fast=215_000.0, gpu=1.2e6, saelens=269_000.0),
    measured("cuda", "NVIDIA A100-SXM4-80GB", "2026-11-20", fast=150_000.0, saelens=90_000.0),
]


@pytest.mark.parametrize(
    ("setting", "architecture", "dtype", "kind", "expected"),
    [
        ("auto", "topk", "cpu", "cpu", ("fast", "CPU")),
        ("auto", "batchtopk", "cuda", "NVIDIA H200", ("gpu", "2026-12-01")),  # the newest
        ("auto", "topk", "cuda", "NVIDIA A100-SXM4-80GB", ("fast", "A100")),  # its own
        ("auto", "topk", "cuda", "NVIDIA L40S", ("gpu", "none on NVIDIA L40S")),  # unmeasured
        ("auto", "topk", "mps", "mps", ("saelens", "no sae_train measurement on mps")),
        ("auto", "jumprelu", "cuda", "NVIDIA H200", ("saelens", "the only one")),
        ("saelens", "topk", "cuda", "NVIDIA H200", ("saelens", "set in the config")),
    ],
)
def test_auto_picks_the_trainer_measured_fastest_on_the_device(
    setting, architecture, dtype, kind, expected
):
    choice = pick(setting, architecture, dtype, kind, RESULTS)
    assert choice.trainer == expected[0] and expected[1] in choice.why, choice
    assert choice == pick(setting, architecture, dtype, kind, list(reversed(RESULTS)))
    kept = resumed(Choice("saelens", "auto", "then"), {"trainer": choice.to_dict()})
    assert kept.trainer == choice.trainer  # a resumed run keeps its checkpoint's trainer
