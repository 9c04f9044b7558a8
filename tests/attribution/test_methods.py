"""The attribution-method registry (attribution/methods): the schema, the config, the scores, the
edges and the planned pass counts (attribution/plan.py) all read it, so a method added there runs
everywhere."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.spliced import D_SAE, tiny_spliced

from circuitflow import config as cf
from circuitflow.attribution import graph as circuit_graph
from circuitflow.attribution import methods, scores
from circuitflow.attribution import plan as attribution_plan
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.methods import Method, atp
from circuitflow.errors import ConfigError


@pytest.fixture(scope="module")
def tiny():
    return tiny_spliced(8)


def test_registry_and_schema_enum_agree():
    """The schema's enum of `attribution.method` (the config's single source) names exactly the
    registered methods, in the same order, and its default is the config's and registered."""
    method = cf.load_schema()["properties"]["attribution"]["properties"]["method"]
    assert method["enum"] == list(methods.REGISTRY)
    assert method["default"] == AttributionConfig().method
    assert method["default"] in methods.REGISTRY
    for name, record in methods.REGISTRY.items():
        assert record.name == name
        assert record.description


def test_config_accepts_registered_methods_only():
    for name in methods.REGISTRY:
        assert AttributionConfig.from_dict({"method": name}).method == name
    with pytest.raises(
        ConfigError, match=r"attribution\.method: 'foo' is not allowed; allowed values: atp, ig"
    ):
        AttributionConfig.from_dict({"method": "foo"})
    assert AttributionConfig(method="ig").method_record is methods.REGISTRY["ig"]
    with pytest.raises(ConfigError, match="allowed values"):
        AttributionConfig(method="foo").method_record  # noqa: B018


def test_perf_charges_the_records_passes(tiny, monkeypatch):
    """attribution_plan.passes takes the score pass from the record (plus the corrupted forward
    before it), whatever it is; the edges reuse its gradients, so charge no pass of it."""
    record = Method(
        name="probe",
        score_batch=atp.score_batch,
        passes=lambda cfg: 7.0 * cfg.ig_steps,
        memory_factor=1.0,
        description="a record with passes of its own",
    )
    monkeypatch.setitem(methods.REGISTRY, "probe", record)
    model_cfg = tiny[0].cfg
    cfg = AttributionConfig(
        method="probe", ig_steps=2, validation_prompts=4, max_graph_nodes=7, bridge_features=0
    )
    planned = attribution_plan.passes(model_cfg, 2, cfg, 8, D_SAE)
    assert planned["probe"] == 1.0 + 14.0
    assert planned["edges"] == 4 / 8 * (2.0 + 7)
    # The two registered methods: a corrupted forward, a clean one, a forward and backward
    # per step (ig) or one (atp).
    ig = attribution_plan.passes(model_cfg, 2, replace(cfg, method="ig"), 8, D_SAE)
    at = attribution_plan.passes(model_cfg, 2, replace(cfg, method="atp"), 8, D_SAE)
    assert (ig["ig"], ig["edges"]) == (2.0 + 3.0 * 2, 4 / 8 * (2.0 + 7))
    assert (at["atp"], at["edges"]) == (4.0, 4 / 8 * (2.0 + 7))


def _doubled(sp, batch, corr, cfg):
    out, metric, clean, grads = atp.score_batch(sp, batch, corr, cfg)
    return {k: 2 * v for k, v in out.items()}, metric, clean, {k: 2 * g for k, g in grads.items()}


def test_a_registered_method_runs_through_scores_edges_and_the_count(tiny, monkeypatch):
    """A record added to the registry alone (no other change) is the one scores.score_nodes and
    graph.compute_edges run, under its own name: a method that doubles atp's scores and
    gradients gives twice atp's node scores and inner edge weights (edges into the logit are
    exact, so unchanged), and the stage's pass count for it is what attribution/plan.py plans
    from its record."""
    monkeypatch.setitem(
        methods.REGISTRY,
        "doubled",
        Method(
            name="doubled",
            score_batch=_doubled,
            passes=atp.passes,
            memory_factor=1.0,
            description="atp, times two",
        ),
    )
    model, saes, prompts = tiny
    base = AttributionConfig(method="atp", validation_prompts=4, validation_features=6)
    cfg = replace(base, method="doubled")
    ref = scores.score_nodes(model, prompts, saes, base)
    got = scores.score_nodes(model, prompts, saes, cfg)
    assert (ref.frame["score_atp"] != 0).any()
    for suffix in ("", "_selection", "_validation"):
        assert got.frame[f"score_doubled{suffix}"].equals(2 * ref.frame[f"score_atp{suffix}"])
    assert got.frame["score_exact"].equals(ref.frame["score_exact"])
    counted = got.spliced.counter.summary(len(prompts))["forward_equivalents_by_part"]
    planned = attribution_plan.passes(model.cfg, len(saes), cfg, len(prompts), D_SAE)
    assert counted["doubled"] == pytest.approx(planned["doubled"])
    assert "atp" not in counted

    nodes = circuit_graph.select_nodes(scores.with_score(ref.frame, "atp"), base)
    subset = scores.validation_prompts(prompts, base)
    want = circuit_graph.compute_edges(ref.spliced, subset, nodes, base, ref.kept)
    have = circuit_graph.compute_edges(got.spliced, subset, nodes, cfg, got.kept)
    assert set(have) == set(want)
    inner = [e for e in want if e[1] != circuit_graph.LOGIT]
    assert inner and any(want[e] != 0 for e in inner)
    for edge, weight in want.items():
        factor = 1.0 if edge[1] == circuit_graph.LOGIT else 2.0
        assert have[edge] == pytest.approx(factor * weight, rel=1e-12, abs=1e-12), edge


def test_memory_estimate_reads_the_method_factor(monkeypatch):
    """attribution.plan.estimate_attribution charges each prompt the method's memory_factor
    times the gradient pass: a method that holds twice as much per prompt plans half the
    batch."""
    import dataclasses

    import torch

    from circuitflow.attribution import plan
    from circuitflow.model import architectures

    cfg = architectures.config("gpt2-small", n_layers=2, d_vocab=1000)
    args = (cfg, 10**6, 16, 2, 2048, torch.float32, "cpu")
    base = plan.estimate_attribution(*args, "atp")
    double = dataclasses.replace(methods.get("atp"), name="double", memory_factor=2.0)
    monkeypatch.setitem(methods.REGISTRY, "double", double)
    doubled = plan.estimate_attribution(*args, "double")
    assert abs(doubled.per_context_device - 2 * base.per_context_device) <= 1  # int()
    assert doubled.weights == base.weights
