"""End-to-end SAE training on activations captured from a real HookedTransformer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.dag import REPO
from helpers.sae_data import contexts, tiny_model, write_capture
from sae_lens import SAE, HookedSAETransformer

from circuitflow.capture.files import read_activation_info
from circuitflow.errors import ConfigError
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.data import load_eval_contexts
from circuitflow.sae.metrics import as_hooked_sae_transformer, evaluate_sae
from circuitflow.sae.stage import train_sae

torch.set_num_threads(1)
METRIC_KEYS = {
    "l0",
    "explained_variance",
    "dead_fraction",
    "ce_loss_recovered",
    "ce_clean",
    "ce_sae",
    "ce_zero",
    "tokens_trained",
    "wall_time_s",
    "tokens_per_s",
    "peak_memory_mb",
    "architecture",
    "controller_history",
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    model = tiny_model()
    acts = write_capture(model, root / "activations/resid_post/layer_0.h5")
    out = root / "saes/resid_post/layer_0"
    cfg = SAETrainConfig(total_tokens=120_000, batch_size=512, k=8, eval_contexts=32)
    metrics = train_sae(acts, out, cfg, model)
    return model, acts, out, metrics


def test_output_is_a_spliceable_saelens_sae(trained):
    model, acts, out, metrics = trained
    assert sorted(p.name for p in out.iterdir()) == [
        "cfg.json",
        "metrics.json",
        "sae_weights.safetensors",
    ]
    assert not out.with_name(out.name + ".ckpt").exists()  # checkpoints cleaned up
    sae = SAE.load_from_disk(out)
    assert sae.cfg.metadata.hook_name == "blocks.0.hook_resid_post"
    assert sae.cfg.d_sae == 8 * 32
    hooked = HookedSAETransformer(model.cfg)
    hooked.load_state_dict(model.state_dict())
    toks = contexts(4)
    clean = hooked(toks)
    hooked.add_sae(sae)
    assert "blocks.0.hook_resid_post" in hooked.acts_to_saes
    spliced = hooked(toks)
    assert not torch.allclose(clean, spliced)
    on_disk = json.loads((out / "metrics.json").read_text())
    assert METRIC_KEYS <= set(on_disk)
    assert on_disk == json.loads(json.dumps(metrics))


def test_topk_quality_on_tiny_model(trained):
    *_, metrics = trained
    assert metrics["l0"] == pytest.approx(8.0)
    assert metrics["explained_variance"] > 0.85
    assert metrics["dead_fraction"] <= 0.2
    assert metrics["tokens_trained"] == (120_000 // 512) * 512
    # Zero-ablating layer 0's residual stream wrecks the model; the SAE nearly restores it.
    assert metrics["ce_zero"] > metrics["ce_clean"] + 1.0
    assert metrics["ce_loss_recovered"] > 0.9


def test_evaluation_passes_counted_per_context(trained):
    """Three model passes per evaluation context (clean, SAE spliced, zero-ablated); training
    steps are SAE work, counted as tokens_trained, not model passes."""
    *_, metrics = trained
    assert metrics["forward_equivalents_per_prompt"] == pytest.approx(3.0)
    parts = metrics["forward_equivalents_by_part"]
    assert parts == {"ce_clean": 1.0, "ce_sae": 1.0, "ce_zero": 1.0}
    assert metrics["forward_equivalents_total"] == 3 * 32
    assert metrics["forward_equivalents_unit"] == "evaluation context"


def test_ce_comes_from_real_splicing(trained):
    model, acts, out, metrics = trained
    info = read_activation_info(acts)
    ctx = load_eval_contexts(info, 32)
    sae = SAE.load_from_disk(out)
    # The same number by hand: replace the hook's output with the SAE's reconstruction (BOS kept).
    hooked = as_hooked_sae_transformer(model)

    def splice(act, hook):
        keep = (ctx != info.bos_token_id).unsqueeze(-1)
        return torch.where(keep, sae(act), act)

    with torch.no_grad():
        manual = hooked.run_with_hooks(
            ctx, return_type="loss", fwd_hooks=[(info.hook_name, splice)]
        ).item()
    assert metrics["ce_sae"] == pytest.approx(manual, abs=1e-4)
    # A broken SAE (decoder rows shuffled) destroys the reconstruction and the recovered CE.
    with torch.no_grad():
        sae.W_dec.copy_(
            sae.W_dec[torch.randperm(sae.cfg.d_sae, generator=torch.Generator().manual_seed(0))]
        )
    broken = evaluate_sae(model, sae, ctx, exclude_bos=True, bos_token_id=info.bos_token_id)
    assert broken["explained_variance"] < 0.2
    assert broken["ce_loss_recovered"] < metrics["ce_loss_recovered"] - 0.5
    assert broken["ce_clean"] == pytest.approx(metrics["ce_clean"])


def test_batchtopk_trains_and_saves_as_jumprelu(tmp_path):
    model = tiny_model()
    acts = write_capture(model, tmp_path / "layer_1.h5", layer=1, n_contexts=64)
    cfg = SAETrainConfig(
        architecture="batchtopk", total_tokens=30_000, batch_size=256, k=8, eval_contexts=8
    )
    metrics = train_sae(acts, tmp_path / "out", cfg, model)
    sae = SAE.load_from_disk(tmp_path / "out")
    assert sae.cfg.architecture() == "jumprelu"
    assert sae.cfg.metadata.hook_name == "blocks.1.hook_resid_post"
    assert metrics["architecture"] == "batchtopk" and 2 < metrics["l0"] < 40


def test_batch_size_auto_comes_from_the_memory_plan(tmp_path, monkeypatch):
    from circuitflow import memory
    from circuitflow.sae import stage as sae_stage

    model = tiny_model()
    acts = write_capture(model, tmp_path / "layer_0.h5", n_contexts=64)
    info = read_activation_info(acts)
    cfg = SAETrainConfig(total_tokens=8192, batch_size="auto", k=8, eval_contexts=8)
    estimate = sae_stage.memory_estimate(cfg, info, "cpu", resident=0)
    # A machine with room for 300 rows: the plan picks 256, the largest power of two that fits.
    room = estimate.total(300)
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(room / 0.8))
    plan = sae_stage.plan_auto_batch(cfg, info, "cpu")
    assert plan.batch_size == 256 and plan.estimate_bytes == estimate.total(256)
    metrics = train_sae(acts, tmp_path / "out", cfg, model)
    assert metrics["config"]["batch_size"] == 256
    assert metrics["tokens_trained"] == 8192
    assert metrics["planned_memory_mb"] > 0


def test_config_errors_name_the_key():
    """The schema checks a section given to a stage by hand too, in its own words."""
    with pytest.raises(ConfigError, match="sae.batch_size"):
        SAETrainConfig.from_dict({"batch_size": "big"})
    with pytest.raises(ConfigError, match="sae.architecture: 'gated' is not allowed"):
        SAETrainConfig.from_dict({"architecture": "gated"})
    with pytest.raises(ConfigError, match="unknown key sae.widht; allowed keys: architecture"):
        SAETrainConfig.from_dict({"widht": 3})
    with pytest.raises(ConfigError, match="unknown key sae.controller.kd; allowed keys: coef"):
        SAETrainConfig.from_dict({"controller": {"kd": 1}})


def test_cli_rejects_incomplete_activations_with_one_line(tmp_path):
    """Refused by the stage's own checks (sae.inputs) before SAELens is imported: a stand-in
    `sae_lens` that fails on import shadows the real one."""
    acts = write_capture(tiny_model(), tmp_path / "layer_0.h5", n_contexts=4, complete=False)
    config = {"seed": 0, "device": "cpu", "model": {"dtype": "float32"}, "sae": {}}
    shadow = tmp_path / "shadow" / "sae_lens"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('sae_lens imported before the check')")
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))

    def train(sae: dict) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(REPO / "scripts/train_sae.py"), "--activations", str(acts),
               "--model-json", str(tmp_path / "model.json"), "--out", str(tmp_path / "out"),
               "--config", json.dumps(config | {"sae": sae})]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": path}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)

    proc = train({})
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "layer_0.h5" in last and "incomplete" in last
    assert not (tmp_path / "out").exists()
    bad = train({"lr": -1})
    assert bad.returncode == 2 and "sae.lr" in bad.stderr.strip().splitlines()[-1]
    one_file = train({"kind": "transcoder"})
    assert one_file.returncode == 2, one_file.stderr
    assert "--activations: sae.kind transcoder" in one_file.stderr.strip().splitlines()[-1]
