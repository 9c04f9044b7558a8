"""The embedded default, end to end: the behaviours it was built to have are really there."""

from __future__ import annotations

import pytest
from helpers.dag import REPO, read_json

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


def test_interventions_stay_within_the_planned_passes(default_results):
    """interventions.plan.passes (what walltimes and the GPU-hours estimate charge) bounds the
    stage's own count (perf.PassCounter) part by part, and but for pruning stays within 2x of
    it: a walltime from the bound is neither short nor padded tenfold. Pruning's bound is its
    worst case (3 runs a node a round) and whether a prefix is pruned at all depends on its
    size, so it is checked against the bound alone (induction's 273-node prefix is not
    pruned, facts' 48-node one took 135 runs of its 626)."""
    from circuitflow import config as cf_config
    from circuitflow.interventions import plan as interventions_plan
    from circuitflow.interventions.config import InterventionsConfig
    from circuitflow.model import architectures

    config = cf_config.load(REPO / "config" / "config.yaml")
    cfg = architectures.model_cfg(config)
    d_sae = config["sae"]["expansion_factor"] * cfg.d_model
    icfg = InterventionsConfig.from_dict(config["interventions"])
    planned = interventions_plan.passes(cfg, len(config["layers"]), d_sae, icfg)
    for behaviour in ("induction", "facts"):
        summary = read_json(default_results / "interventions" / behaviour / "summary.json")
        counted = summary["forward_equivalents_by_part"]
        assert set(counted) <= set(planned) and set(planned) - set(counted) <= {"pruning"}
        for part, passes in counted.items():
            assert passes <= planned[part], (behaviour, part, passes, planned[part])
        total = summary["forward_equivalents_per_prompt"] - counted.get("pruning", 0)
        rest = sum(planned.values()) - planned["pruning"]
        assert total <= rest <= 2 * total, (behaviour, total, planned)


def test_disk_plan_matches_the_files_the_default_run_wrote(default_results):
    """resources.disk_plan (what `snakemake check` requires free) against the files on disk:
    the activation files and the SAEs within 5%, and the whole results directory within the
    plan."""
    from circuitflow import config as cf_config
    from circuitflow import resources

    plan = resources.disk_plan(cf_config.load(REPO / "config" / "config.yaml"))

    def size(pattern: str) -> int:
        return sum(p.stat().st_size for p in default_results.glob(pattern) if p.is_file())

    acts = size("activations/**/*.h5") + size("activations/tokens.*")
    assert acts == pytest.approx(plan["activations"], rel=0.05)
    assert size("saes/**/sae_weights.safetensors") == pytest.approx(plan["saes"], rel=0.05)
    assert size("**/*") <= sum(plan.values())
