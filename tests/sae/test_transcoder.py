"""Transcoders (sae.kind transcoder): trained on one capture's MLP input and output, saved as
SAELens transcoders, and measured against references computed here by other means."""

from __future__ import annotations

import copy

import pytest
import sae_lens
import torch
from helpers.sae_data import D_MODEL, tiny_model, write_capture
from helpers.transcoders import swapped_loss
from sae_lens import SAE
from sae_lens.saes.sae import TrainStepInput

from circuitflow.capture.files import read_activation_info
from circuitflow.errors import ActivationFileError, ConfigError
from circuitflow.sae.architectures import ARCHITECTURES, build_training_sae
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.data import load_eval_contexts
from circuitflow.sae.fast import sparse_forward
from circuitflow.sae.stage import train_sae
from circuitflow.sae.transcoder import TopKTranscoder, save_transcoder

torch.set_num_threads(1)
IN, OUT = "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"


def capture_pair(model, root, n_contexts=256):
    return [
        write_capture(model, root / f"activations/{site}/layer_0.h5", n_contexts, site=site)
        for site in ("mlp_in", "mlp_out")
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("transcoder")
    model = tiny_model()
    acts = capture_pair(model, root)
    out = root / "saes/mlp_out/layer_0"
    cfg = SAETrainConfig(kind="transcoder", total_tokens=60_000, batch_size=512, k=8)
    cfg.eval_contexts = 32
    return model, acts, out, train_sae(acts, out, cfg, model)


def test_saved_as_a_saelens_transcoder(trained):
    _, _, out, metrics = trained
    tc = SAE.load_from_disk(out)
    assert isinstance(tc, sae_lens.Transcoder) and isinstance(tc, TopKTranscoder)
    assert tc.cfg.d_in == tc.cfg.d_out == D_MODEL and tc.cfg.k == 8
    assert (tc.cfg.metadata.hook_name, tc.cfg.metadata.hook_name_out) == (IN, OUT)
    assert not tc.cfg.apply_b_dec_to_input
    assert metrics["kind"] == "transcoder" and metrics["site"] == "mlp_out"
    assert (metrics["hook_name"], metrics["hook_name_out"]) == (IN, OUT)
    assert metrics["l0"] == pytest.approx(8.0, abs=0.05)


@torch.no_grad()
def test_metrics_match_the_model_with_its_mlp_swapped_out(trained):
    """metrics.json against references computed here: the explained variance of the MLP's
    output from the clean run's cache, and the loss with the block's MLP module swapped for
    the transcoder. A transcoder trained on its input instead of the MLP's output fails the
    quality bar."""
    model, acts, out, metrics = trained
    tc = SAE.load_from_disk(out)
    toks = load_eval_contexts(read_activation_info(acts[0]), 32)
    _, cache = model.run_with_cache(toks, names_filter=[IN, OUT])
    x, y = cache[IN][:, 1:].reshape(-1, D_MODEL), cache[OUT][:, 1:].reshape(-1, D_MODEL)
    y, pred = y.double(), tc(x).double()
    ev = 1 - (y - pred).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    assert metrics["explained_variance"] == pytest.approx(ev.item(), abs=1e-6)

    assert metrics["ce_sae"] == pytest.approx(swapped_loss(model, {0: tc}, toks), abs=1e-5)
    assert metrics["ce_clean"] == pytest.approx(model(toks, return_type="loss").item(), abs=1e-5)
    assert metrics["explained_variance"] > 0.9 and metrics["ce_loss_recovered"] > 0.9, metrics


def perturbed_transcoder(architecture: str, seed: int = 0):
    cfg = SAETrainConfig(architecture=architecture, kind="transcoder", k=4, d_sae=128)
    torch.manual_seed(seed)
    tc = build_training_sae(cfg, D_MODEL, IN, "cpu", OUT)
    with torch.no_grad():
        tc.W_enc.normal_(0, 0.3)
        tc.W_dec.mul_(torch.rand(128, 1) + 0.5)
        tc.b_dec.normal_()
        tc.b_enc.normal_(0, 0.1)
    return tc


def test_both_trainers_fit_the_mlp_output_as_a_dense_reference_does():
    """The fast trainer's and SAELens's losses on a [mlp_in | mlp_out] batch equal a TopK
    transcoder's MSE written out here from the weights; their gradients agree, AuxK included."""
    g = torch.Generator().manual_seed(1)
    x, y = 2 * torch.randn(64, D_MODEL, generator=g), torch.randn(64, D_MODEL, generator=g)
    ours = perturbed_transcoder("topk")
    ref = copy.deepcopy(ours)
    with torch.no_grad():
        norms = ours.W_dec.norm(dim=-1)
        scores = (x @ ours.W_enc + ours.b_enc) * norms
        top = scores.topk(4, dim=-1)
        acts = torch.zeros_like(scores).scatter(-1, top.indices, top.values.relu())
        mse = ((acts / norms) @ ours.W_dec + ours.b_dec - y).pow(2).sum(-1).mean()
    dead = torch.zeros(128, dtype=torch.bool)
    dead[::3] = True
    step = sparse_forward(ours, torch.cat([x, y], 1), dead)
    step.loss.backward()
    expected = ref.training_forward_pass(
        TrainStepInput(
            sae_in=torch.cat([x, y], 1), coefficients={}, dead_neuron_mask=dead,
            n_training_steps=0, is_logging_step=False,
        )
    )  # fmt: skip
    expected.loss.backward()
    torch.testing.assert_close(step.losses["mse_loss"], mse, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(expected.losses["mse_loss"], mse, rtol=1e-5, atol=1e-6)
    aux = step.losses["auxiliary_reconstruction_loss"]
    assert aux > 0
    torch.testing.assert_close(aux, expected.losses["auxiliary_reconstruction_loss"])
    for name, p in ours.named_parameters():
        want = dict(ref.named_parameters())[name].grad
        scale = want.abs().max().item()
        torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-6 * scale, msg=name)


# The SAELens class each architecture's transcoder loads as (its registry entry's `transcoder`).
LOADS_AS = {
    "topk": TopKTranscoder,
    "standard": sae_lens.Transcoder,
    "jumprelu": sae_lens.JumpReLUTranscoder,
    "batchtopk": sae_lens.JumpReLUTranscoder,
}


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_saved_transcoder_computes_what_the_trained_one_does(tmp_path, architecture):
    """Every registered architecture trains and saves as a transcoder that SAELens loads (an
    architecture added to the registry is saved as its entry's `transcoder` says, so it is
    checked here too), as the class named in LOADS_AS; outside BatchTopK (whose batch-level
    selection becomes a threshold, as SAELens saves BatchTopK SAEs) the loaded transcoder's
    output equals the training transcoder's own encode and decode."""
    tc = perturbed_transcoder(architecture).eval()
    if architecture == "jumprelu":
        with torch.no_grad():
            tc.threshold.fill_(0.3)
    save_transcoder(tc, tmp_path)
    loaded = SAE.load_from_disk(tmp_path)
    assert isinstance(loaded, sae_lens.Transcoder), type(loaded)
    assert type(loaded) is LOADS_AS.get(architecture, type(loaded))
    if architecture == "batchtopk":
        return
    x = 2 * torch.randn(64, D_MODEL, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = tc.decode(tc.encode(x))
        got = loaded(x)
    assert (loaded.encode(x) != 0).sum(-1).float().mean() > 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_new_architecture_saves_its_transcoders_as_its_entry_says(tmp_path, monkeypatch):
    """An architecture added to the registry alone (no other table to edit: docs/extending.md's
    recipe) trains and saves a transcoder: save_transcoder reads its entry's `transcoder`."""
    import dataclasses

    from circuitflow.sae import architectures

    entry = dataclasses.replace(ARCHITECTURES["standard"])
    monkeypatch.setitem(architectures.ARCHITECTURES, "relu_copy", entry)
    tc = perturbed_transcoder("relu_copy").eval()
    save_transcoder(tc, tmp_path)
    assert type(SAE.load_from_disk(tmp_path)) is sae_lens.Transcoder


def test_unpaired_files_are_refused_in_one_line(tmp_path):
    model = tiny_model()
    a = write_capture(model, tmp_path / "mlp_in.h5", 64, site="mlp_in")
    b = write_capture(model, tmp_path / "mlp_out.h5", 32, site="mlp_out")
    cfg = SAETrainConfig(kind="transcoder", total_tokens=1024, batch_size=256)
    with pytest.raises(ActivationFileError, match="n_tokens differs"):
        train_sae([a, b], tmp_path / "out", cfg, model)
    with pytest.raises(ConfigError, match="--activations: sae.kind transcoder"):
        train_sae([a], tmp_path / "out", cfg, model)
    assert not (tmp_path / "out").exists()
