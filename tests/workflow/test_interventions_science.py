"""Interventions on the embedded default (the whole DAG, `default_results`): ablations confirm the
circuits the synthetic language plants. The induction heads are found here from attention
patterns alone (`attention_scores`), independently of attribution and of the interventions code.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.attention import attention_scores
from helpers.schemas import check_outputs

from circuitflow.interventions.ablation import Intervener
from circuitflow.model.load import load_model
from circuitflow.nodes import Node

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(default_results):
    torch.set_num_threads(1)
    results = default_results
    model = load_model(results / "model", "cpu", "float32")
    prompts = pd.read_parquet(results / "prompts" / "induction.parquet")
    _, ind = attention_scores(model, prompts)
    # Induction needs composition: induction heads sit above layer 0. The top one, and every
    # head scoring at least half as much (redundant copies are ablated together).
    upper = ind[1:]
    layer, head = np.unravel_index(np.argmax(upper), upper.shape)
    top = (int(layer) + 1, int(head))
    strong = np.argwhere(upper >= 0.5 * upper.max())
    heads = [(int(layer) + 1, int(head)) for layer, head in strong]
    return results, model, top, sorted(heads), ind


def summary(results, behaviour):
    return json.loads((results / "interventions" / behaviour / "summary.json").read_text())


def heads_table(results, behaviour):
    return pd.read_parquet(results / "interventions" / behaviour / "heads.parquet")


def drop_when_ablated(model, results, behaviour, heads, kind) -> float:
    prompts = pd.read_parquet(results / "prompts" / f"{behaviour}.parquet")
    iv = Intervener(model, prompts, kind)
    base = iv.run(()).logit_diff.mean()
    ablated = iv.run([Node("head", layer, h) for layer, h in heads]).logit_diff.mean()
    return float(1 - ablated / base)


def test_ablating_the_induction_head_breaks_induction(setup):
    """Mean ablation of the induction head (with any redundant copy) removes >= 70% of the logit
    difference; a random other head of the same layer removes <= 20%."""
    results, model, top, ind_heads, ind = setup
    s = summary(results, "induction")
    assert s["ablation"] == "mean"
    table = heads_table(results, "induction").set_index(["layer", "head"])
    if ind_heads == [top]:
        drop = table.loc[top, "drop_frac"]
        assert table.loc[top, "drop_frac_std"] < 0.1
        assert table.loc[top, "score_ci_low"] > 0
    else:
        drop = drop_when_ablated(model, results, "induction", ind_heads, "mean")
    assert drop >= 0.7, (top, ind_heads, drop, ind, table)

    layer = top[0]
    others = [h for h in range(model.cfg.n_heads) if (layer, h) not in ind_heads]
    others = others or [h for h in range(model.cfg.n_heads) if (layer, h) != top]
    rand = (layer, int(np.random.default_rng(0).choice(others)))
    assert abs(table.loc[rand, "drop_frac"]) <= 0.2, (rand, table)


@pytest.mark.parametrize("behaviour", ["induction", "facts"])
def test_small_circuit_is_faithful_on_held_out_prompts_and_random_circuits_are_not(
    setup, behaviour
):
    """Over components, SAE features and error terms: a circuit well short of every candidate
    node (at most 60% for induction, 20% of every node the model has for facts), chosen on
    the selection half of the prompts, stays within 0.15 of its faithfulness on the held-out
    half, which neither the ranking nor the size saw; random circuits of that size and make-up
    stay near 0."""
    results, model, *_ = setup
    s = summary(results, behaviour)
    kinds = s["n_nodes_by_kind"]
    assert kinds["feature"] > 100 and kinds["error"] == 2, kinds
    n = s["circuit_size"]
    assert n is not None and s["circuit_size_source"].startswith("smallest"), s
    # Induction's circuit holds the features of the many tokens it copies, and its size moves
    # with the SAEs' training: 291 to 379 of 742-764 candidates on earlier machines, 392 of 764
    # on an AVX-512 EPYC, where one layer-0 feature whose own effect is 0.0002 (rank 540) lifts
    # the curve from 0.787 to 0.821 at size 392 (features that matter only jointly). Facts: 43-49.
    assert n <= {"induction": 0.6, "facts": 0.5}[behaviour] * s["n_nodes"], s["faithfulness_curve"]
    d_saes = [json.loads(c.read_text())["d_sae"] for c in results.glob("saes/*/*/cfg.json")]
    model_nodes = 1 + model.cfg.n_layers * (model.cfg.n_heads + 1) + sum(d + 1 for d in d_saes)
    assert n <= model_nodes * {"induction": 0.5, "facts": 0.2}[behaviour]
    assert s["smallest_faithful_by_kind"].get("feature", 0) > 0  # features carry the circuit
    assert s["n_prompts_heldout"] >= 100
    # Ranked by each node's score against the run's mean ablation, induction's curve reaches the
    # threshold on the selection half at 273 nodes (held out 0.68; ranked by patching score,
    # 392 and 0.86), though at every size both measured its held-out faithfulness is above the
    # patching ranking's: the selection half picks the size, so the held-out value lags it.
    # Facts: 48 nodes, 0.80 and 0.75 (benchmarks/results/circuit_search.json).
    assert s["faithfulness_heldout"] >= 0.65, s
    assert s["faithfulness"] - s["faithfulness_heldout"] <= 0.15, s
    assert s["completeness_heldout"] > 0.5, s
    # Induction copies whichever token the prompt repeats, so the feature-level circuit holds
    # the features of many tokens and the curve rises late (measured AUC 0.17, 291 of 742
    # nodes); facts rise early (0.50, 43 of 588). Random circuits' curves stay near 0.
    assert s["faithfulness_auc"] > {"induction": 0.1, "facts": 0.3}[behaviour], s
    circuits = pd.read_parquet(results / "interventions" / behaviour / "circuits.parquet")
    rand = circuits[(circuits["circuit"] == "random") & (circuits["n"] == n)]
    assert len(rand) >= 5
    for half in ("", "_heldout"):
        assert rand[f"faithfulness{half}"].mean() < 0.1, rand[f"faithfulness{half}"].tolist()
        assert (rand[f"faithfulness{half}"] >= 0.8).mean() == 0
    # Controls with the circuit's make-up by kind: as many heads, MLPs, features, errors.
    top_kinds = sorted(node.split(".")[0] for node in s["circuit"])
    for nodes in rand["nodes"]:
        assert sorted(node.split(".")[0] for node in nodes) == top_kinds


def test_facts_do_not_need_the_induction_heads(setup):
    results, model, top, ind_heads, _ = setup
    kind = summary(results, "facts")["ablation"]
    change = drop_when_ablated(model, results, "facts", ind_heads, kind)
    assert abs(change) <= 0.2, (ind_heads, change)
    across = pd.read_parquet(results / "interventions" / "heads_across_behaviours.parquet")
    row = across.set_index(["behaviour", "layer", "head"])
    assert abs(row.loc[("facts", *top), "drop_frac"]) <= 0.2
    assert row.loc[("induction", *top), "specificity"] > 0


def test_outputs_have_their_schemas(setup):
    results, model, *_ = setup
    for behaviour in ("induction", "facts"):
        s = check_outputs(
            results / "interventions" / behaviour, model.cfg.n_layers, model.cfg.n_heads
        )
        # The stage's cost is counted where its passes run (perf.PassCounter), by part.
        parts = s["forward_equivalents_by_part"]
        assert (
            {"circuits", "heads", "features"}
            <= set(parts)
            <= {"circuits", "pruning", "heads", "features"}
        ), parts
        assert s["forward_equivalents_per_prompt"] == pytest.approx(sum(parts.values()))
    across = pd.read_parquet(results / "interventions" / "heads_across_behaviours.parquet")
    assert set(across["behaviour"]) == {"induction", "facts"}
    assert (results / "interventions" / "heads_across_behaviours.png").stat().st_size > 1000


@pytest.mark.parametrize("behaviour", ["induction", "facts"])
def test_inert_heads_and_flags(setup, behaviour):
    """The pruned heads (W_O = 0) are inert and carry no difference, and are left out of the
    top heads, so the pairs
    and triplets are those of the live heads (before: 10 pairs and triplets among 5 heads, 2 of
    them pruned, mostly the live sets again); every random control that reaches its circuit's
    value and every faithfulness under the threshold is flagged, and nothing else."""
    from circuitflow.interventions.flags import RANDOM_CONTROLS, flags_of

    results, model, *_ = setup
    s = summary(results, behaviour)
    pruned = [
        f"L{layer}H{head}"
        for layer, block in enumerate(model.blocks)
        for head in range(model.cfg.n_heads)
        if block.attn.W_O[head].abs().sum() == 0
    ]
    assert len(pruned) == 5 and s["left_out_heads"] == pruned
    assert set(pruned) <= set(s["inert_heads"]) and set(pruned) <= set(s["no_difference_heads"])
    assert len(s["top_k_heads"]) == 3 and not set(s["top_k_heads"]) & set(pruned)
    assert not {f"L{h['layer']}H{h['head']}" for h in s["top_heads"]} & set(pruned)
    sets = pd.read_parquet(results / "interventions" / behaviour / "head_sets.parquet")
    top_k = sets[sets["set"] == "top_k"]
    assert len(top_k) == 3 + 1 and not top_k["heads"].str.contains("|".join(pruned)).any()
    for key, control in RANDOM_CONTROLS[:4]:
        assert s["random_reaches_circuit"][key] is (s[control] >= s[key])
    assert s["below_threshold"]["faithfulness_heldout"] is (
        s["faithfulness_heldout"] < s["faithfulness_threshold"]
    )
    assert s["flags"] == flags_of(s)
    flagged = {f["key"] for f in s["flags"]}
    expected = {k for k, v in s["random_reaches_circuit"].items() if v}
    expected |= {k for k, v in s["below_threshold"].items() if v}
    assert flagged == expected
    # The attribution graph's nodes keep little of the behaviour as a circuit (measured 0.001
    # held out on induction, 0.25 on facts): flagged.
    assert "graph_circuit.faithfulness_heldout" in flagged
