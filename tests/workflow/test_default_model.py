"""The embedded default, end to end: the behaviours it was built to have are really there."""

from __future__ import annotations

import pytest
from helpers.dag import read_json

pytestmark = pytest.mark.slow


def test_default_model_reaches_the_baseline_accuracy(default_results):
    assert read_json(default_results / "model" / "model.json")["eval_loss"] < 3.5
    for behaviour in ("induction", "facts"):
        summary = read_json(default_results / "baseline" / f"{behaviour}.json")
        assert summary["n_prompts"] == 256
        assert summary["accuracy"] >= 0.95, (behaviour, summary["accuracy"])
        assert summary["logit_diff_mean"] > 1.0
        # Corrupting the prompt removes the information the answer depends on.
        assert summary["corrupted_logit_diff_mean"] < summary["logit_diff_mean"] - 1.0


def test_default_saes_meet_the_quality_bar(default_results):
    """Every layer's SAE at default settings, measured by splicing it into the model."""
    from sae_lens import SAE

    for layer in (0, 1):
        sae_dir = default_results / "saes" / "resid_post" / f"layer_{layer}"
        metrics = read_json(sae_dir / "metrics.json")
        assert metrics["explained_variance"] >= 0.9, metrics
        assert metrics["ce_loss_recovered"] >= 0.9, metrics
        assert metrics["dead_fraction"] <= 0.2, metrics
        assert metrics["ce_zero"] > metrics["ce_sae"] >= metrics["ce_clean"] - 0.05
        sae = SAE.load_from_disk(str(sae_dir))
        assert sae.cfg.metadata.hook_name == f"blocks.{layer}.hook_resid_post"
