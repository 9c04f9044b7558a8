"""Degenerate inputs through attribution, interventions and the report's behaviour page on the
tiny spliced model: dead SAEs (no feature fires on any prompt) and a prompt set whose metric is
the same for every prompt (corrupted = clean). Each stage finishes, writes strict JSON (no NaN)
and names each undefined number's reason."""

from __future__ import annotations

import json
import logging

import pandas as pd
import pytest
import torch
from helpers.spliced import tiny_spliced, write_feature_dirs

from circuitflow.attribution import stage as attr_stage
from circuitflow.attribution.config import AttributionConfig
from circuitflow.interventions import stage as iv_stage
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.summary import headline

N_PROMPTS = 12


def run_all(model, saes, prompts, root, feature_dirs=()):
    from circuitflow.report import stage as report_stage
    from circuitflow.report.pages.behaviour import behaviour_sections

    adir, out = root / "attribution" / "b", root / "interventions" / "b"
    acfg = AttributionConfig(method="atp", validation_features=2, context_features=1,
                             n_contexts=2, max_graph_nodes=6, validation_prompts=4)  # fmt: skip
    a = attr_stage.attribute(model, prompts, saes, None, acfg, "b", adir,
                             feature_dirs=feature_dirs)  # fmt: skip
    cfg = InterventionsConfig(n_seeds=2, n_random_circuits=1, top_k_heads=4, n_random_sets=1,
                              n_features=2, n_random_features=1,
                              steering_alphas=(0.0, 2.0))  # fmt: skip
    s = iv_stage.intervene(model, prompts, adir, saes, None, cfg, "b", out, base_seed=0)
    page = "".join(body for _, body in behaviour_sections(adir, out, feature_dirs=feature_dirs))
    report_stage.graph_page("b", adir, out, root / "report" / "graph.html")
    for path in [*adir.glob("*.json"), *out.glob("*.json")]:
        json.loads(path.read_text(), parse_constant=lambda c, p=path: pytest.fail(f"{c}: {p}"))
    return a, s, page


def test_dead_saes_run_through_attribution_and_interventions(tmp_path, caplog):
    """No feature fires: attribution scores every feature 0 (validation: no feature node to
    rank), and the interventions ablate and steer none of them, saying so."""
    torch.set_num_threads(1)
    model, saes, prompts = tiny_spliced(N_PROMPTS, frozen=True)
    with torch.no_grad():
        for sae in saes.values():
            sae.b_enc.fill_(-1e4)
    feature_dirs = write_feature_dirs(model, saes, tmp_path)  # every feature dead
    with caplog.at_level(logging.WARNING):
        a, s, page = run_all(model, saes, prompts, tmp_path, feature_dirs)
    feats = pd.read_parquet(tmp_path / "attribution" / "b" / "features.parquet")
    assert (feats.loc[feats["feature"] >= 0, "score"] == 0).all()
    assert a["validation"]["by_kind"]["feature"]["n_nodes"] == 0
    iv = tmp_path / "interventions" / "b"
    assert pd.read_parquet(iv / "features.parquet").empty
    assert pd.read_parquet(iv / "steering.parquet").empty
    assert "no SAE feature has a non-zero attribution score (64 inert" in caplog.text
    # No feature fires: the circuits are of the components and the SAEs' error terms.
    assert s["n_nodes_by_kind"] == {"embedding": 1, "error": 2, "head": 4, "mlp": 2}
    assert s["faithfulness_curve"] and s["circuit_size"] is not None


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_constant_metric_runs_through_attribution_and_interventions(tmp_path):
    """A model whose logits do not depend on the input (W_U = 0): every ablation leaves the
    metric at 0, so faithfulness and completeness (over m_full - m_empty = 0) are undefined;
    summary.json, its line and both report pages say why, and nothing warns of a NaN."""
    torch.set_num_threads(1)
    model, saes, prompts = tiny_spliced(N_PROMPTS, frozen=True)
    with torch.no_grad():
        model.W_U.zero_()  # every logit b_U: the metric is the same whatever the input
    a, s, page = run_all(model, saes, prompts, tmp_path)
    assert a["metric_clean"] == a["metric_corrupted"] == 0
    v = a["validation"]
    assert v["spearman"] is None and v["n_nodes"] == 0
    assert v["spearman_undefined"].startswith("every node scores exactly 0 by both methods")
    assert v["by_kind"]["head"]["spearman_undefined"] == v["spearman_undefined"]
    assert "Spearman undefined: every node scores exactly 0" in page
    assert (s["logit_diff_clean"], s["logit_diff_empty"]) == (0.0, 0.0)
    assert s["faithfulness"] is None and s["circuit_size"] is None
    assert set(s["undefined"]) == {"faithfulness", "completeness", "faithfulness_heldout",
                                   "completeness_heldout"}  # fmt: skip
    why = "ablating every node leaves the metric where it was on the selection half"
    assert s["undefined"]["faithfulness"].startswith(why)
    assert s["circuit_size_source"].startswith("none: faithfulness is undefined (ablating")
    assert s["flags"] == []  # nothing undefined is flagged as under the threshold
    assert f"undefined: {why}" in page
    graph_page = (tmp_path / "report" / "graph.html").read_text()
    assert "faithfulness is undefined: ablating every node" in graph_page
    assert "faithfulness undefined: ablating" in headline("b", s)
