"""Circuits with planted truth (tests/helpers/planted.py): a four-layer model whose necessary
components and difference carriers are known by construction. Under zero, mean and resample
ablation the reported circuit must be exactly the necessary set, and the patching circuit
exactly the difference carriers; the ablation scores must agree with exact ablation; pruning
must drop every node whose removal changes nothing; CPR and CMD against a hand-computed curve.

Before issue 54 the search ranked by attribution against the corrupted prompt and returned, under
each of the three ablations, the 8 nodes embedding, L3H0, L0H0, MLP0, L1H0 (all-zero weights),
MLP1, L2H0 (the decoy), MLP2: the shared nodes score 0 there and were added in forward order,
zero-weight head and decoy with them, until the curve reached the threshold."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import planted

from circuitflow.attribution import scores as attr
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.splice import Batch
from circuitflow.batching import selection_half
from circuitflow.interventions import circuits as circ
from circuitflow.interventions.ablation import PATCH, Intervener
from circuitflow.interventions.ablation_scores import ablation_scores, baseline, fast_scores
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.heads import single_heads
from circuitflow.interventions.inputs import AttributionResults
from circuitflow.interventions.pruning import Judge, prune
from circuitflow.interventions.selection import (
    circuits,
    inert_heads,
    no_difference_heads,
    untestable_heads,
)
from circuitflow.interventions.stats import Runs
from circuitflow.nodes import Node, component_nodes

KINDS = ("zero", "mean", "resample")
NECESSARY, DIFFERENCE = planted.node_ids()


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    model, prompts = planted.build(), planted.prompts()
    acfg = AttributionConfig(method="ig")
    frame = attr.with_score(attr.score_nodes(model, prompts, {}, acfg).frame, "ig")
    results = AttributionResults(attr.heads_table(frame), attr.components_table(frame), None, None)
    return model, prompts, results


def config(kind: str) -> InterventionsConfig:
    return InterventionsConfig(ablation=kind, circuit_nodes="components", n_random_circuits=0)


def ids(nodes) -> set[str]:
    return {node.id for node in nodes}


@pytest.mark.parametrize("kind", [*KINDS, PATCH])
def test_the_planted_truth_holds_exactly(setup, kind):
    """The ground truth, measured: the known set alone is faithful (every other node ablated
    changes nothing), and removing any one of its nodes breaks it, far below the threshold."""
    model, prompts, _ = setup
    runs = Runs(Intervener(model, prompts, kind), [0, 1, 2])
    universe = component_nodes(4, 1)
    judge = Judge(runs, universe, np.arange(len(prompts)))
    truth = [n for n in universe if n.id in (DIFFERENCE if kind == PATCH else NECESSARY)]
    judge.queue([truth, *([n for n in truth if n != m] for m in truth)])
    assert judge(truth) == pytest.approx(1.0, abs=1e-6)
    for node in truth:
        assert judge([n for n in truth if n != node]) < 0.5, node.id
    for node in universe:
        if node not in truth and (kind != PATCH or node.id not in NECESSARY):
            assert np.array_equal(runs.get([node], 0).logit_diff, runs.base.logit_diff), node


@pytest.mark.parametrize("kind", KINDS)
def test_search_reports_the_necessary_set_and_the_difference_carriers(setup, kind):
    """The stage's search: the circuit it reports is exactly the necessary set (the smallest
    faithful prefix of the ranking and the pruned circuit), the patching circuit exactly the
    difference carriers; both hold on the held-out half."""
    model, prompts, results = setup
    runs = Runs(Intervener(model, prompts, kind), [0, 1, 2])
    c = circuits(runs, results, {}, config(kind), model.cfg, 0, selection_half(prompts))
    assert ids(c.ranked[: c.smallest]) == NECESSARY
    need, carry = c.views.ablation, c.views.patching
    assert (need.judged_by, carry.judged_by) == (kind, PATCH)
    assert ids(need.nodes) == NECESSARY and ids(carry.nodes) == DIFFERENCE
    for view in (need, carry):
        assert view.row()["faithfulness_heldout"] == pytest.approx(1.0, abs=1e-6)
        assert all(v < 0.5 for v in view.pruned.necessity.values())  # each node needed
        assert view.pruned.converged and 0 < view.pruned.runs <= view.pruned.bound_runs
        assert 0 < view.cpr < 1 and view.cmd == pytest.approx(1 - view.cpr)


@pytest.mark.parametrize("kind", KINDS)
def test_ablation_baseline_is_the_interventions_ablation(setup, kind):
    """Each node's spliced forward with its baseline patched in (what the fast scores
    integrate towards) is exactly the Intervener's ablation of that node."""
    model, prompts, _ = setup
    iv = Intervener(model, prompts, kind)
    runs = Runs(iv, [3])
    _, sp = fast_scores(iv, [3], {}, "atp", 1, selection_half(prompts))
    group = iv.groups[0]
    rows = np.arange(len(group.rows))
    batch = Batch(group.clean, group.corrupted, group.answer, group.distractor, group.rows)
    ref = baseline(iv, sp, sp.acts(batch.clean), 0, rows, 3)
    nodes = {}
    for g in sp.groups:  # no SAEs: the embedding, each layer's heads and MLP
        kind = {"attn": "head"}.get(g.kind, g.kind)
        for i in range(model.cfg.n_heads if kind == "head" else 1):
            nodes[(g.name, i)] = Node.of(kind, g.layer, i)
    drops = attr.exact_batch(sp, batch, ref, list(nodes))
    for at, node in nodes.items():
        expect = runs.base.logit_diff[group.rows] - runs.get([node], 3).logit_diff[group.rows]
        np.testing.assert_allclose(drops[at].numpy(), expect, atol=1e-5, err_msg=node.id)


@pytest.mark.parametrize("kind", KINDS)
def test_sae_feature_and_error_baselines_are_the_interventions_ablation(kind):
    """The same for SAE nodes, on a tiny random model with SAEs spliced: a feature or error
    term patched to its baseline in the spliced forward is the Intervener's ablation of it."""
    from helpers.spliced import tiny_spliced

    torch.set_num_threads(1)
    model, saes, prompts = tiny_spliced(8, frozen=True)
    iv = Intervener(model, prompts, kind, saes=saes)
    runs = Runs(iv, [5])
    _, sp = fast_scores(iv, [5], saes, "atp", 1, selection_half(prompts))
    group = iv.groups[0]
    batch = Batch(group.clean, group.corrupted, group.answer, group.distractor, group.rows)
    ref = baseline(iv, sp, sp.acts(batch.clean), 0, np.arange(len(group.rows)), 5)
    nodes = {}
    for g in sp.groups:
        if g.kind == "sae":
            for f in range(4):
                nodes[(g.name + ":feats", f)] = Node("feature", g.layer, f, g.site)
            nodes[(g.name + ":error", 0)] = Node("error", g.layer, -1, g.site)
    drops = attr.exact_batch(sp, batch, ref, list(nodes))
    for at, node in nodes.items():
        expect = runs.base.logit_diff[group.rows] - runs.get([node], 5).logit_diff[group.rows]
        np.testing.assert_allclose(drops[at].numpy(), expect, atol=1e-4, err_msg=node.id)


@pytest.mark.parametrize("kind", KINDS)
def test_ablation_scores_agree_with_exact_ablation(setup, kind):
    """IG from the ablated activations to the clean ones: nodes that cannot move the metric
    score exactly 0, the necessary ones score above 0, and the ranking agrees with exact
    ablation (attribution's validation); `ablation_score` is the exact one where run."""
    model, prompts, _ = setup
    runs = Runs(Intervener(model, prompts, kind), [0, 1, 2])
    s = ablation_scores(runs, {}, selection_half(prompts), "ig", 8)
    frame = s.frame.set_index("node")
    for node, row in frame.iterrows():
        if node in NECESSARY:
            assert row["ablation_score_ig"] > 0.1 and row["ablation_score_exact"] > 1.0, node
        else:
            assert row["ablation_score_ig"] == 0 and row["ablation_score_exact"] == 0, node
    assert s.validation["spearman"] >= 0.8
    assert (frame["ablation_score"] == frame["ablation_score_exact"]).all()
    assert ids(s.ranked()[: len(NECESSARY)]) == NECESSARY
    # A forward for the shapes, ig's clean forward, a forward and backward a step, per seed
    # drawn; and, but for zero ablation, a forward a hook for the reference activations.
    scored = (1 + 1 + 3 * 8) * (3 if kind == "resample" else 1)
    hooks = 0 if kind == "zero" else 1 + 4 * 2
    assert s.passes == scored + hooks


@pytest.mark.parametrize("kind", KINDS)
def test_pruning_drops_zero_weight_heads_decoys_and_idle_nodes(setup, kind):
    """From the circuit the search used to report (the patching ranking's smallest faithful
    prefix: 8 nodes with the all-zero head and the decoy), pruning returns exactly the
    necessary set, batched, within its bound."""
    model, prompts, _ = setup
    runs = Runs(Intervener(model, prompts, kind), [0, 1, 2])
    universe = component_nodes(4, 1)
    before = ["embedding", "head.3.0", "head.0.0", "mlp.0", "head.1.0", "mlp.1", "head.2.0"]
    start = [Node.parse(i) for i in [*before, "mlp.2"]]
    out = prune(runs, universe, start, selection_half(prompts), 0.8, batch=4)
    assert ids(out.nodes) == NECESSARY
    assert set(out.removed) == {"head.1.0", "head.2.0"} and out.converged
    assert out.faithfulness == pytest.approx(1.0, abs=1e-6)
    assert out.runs <= out.bound_runs
    capped = prune(runs, universe, start, selection_half(prompts), 0.8, max_nodes=7)
    assert capped.skipped and capped.nodes == start and capped.removed == []


@pytest.mark.parametrize("kind", KINDS)
def test_inert_means_its_own_ablation_does_nothing(setup, kind):
    """L0H0 computes what the mover needs, the same for clean and corrupted: it carries no
    difference (attribution scores it 0) but is not inert (its own ablation drops the metric by
    more than 3; before, `inert_heads` named it, from its attribution score). The all-zero head
    and the decoy are both, and only they are left out of the head sets."""
    model, prompts, results = setup
    runs = Runs(Intervener(model, prompts, kind), [0, 1, 2])
    singles = single_heads(runs, model.cfg, results.heads, 0.95)
    assert inert_heads(singles) == [(1, 0), (2, 0)]
    assert no_difference_heads(results) == [(0, 0), (1, 0), (2, 0)]
    assert untestable_heads(results, singles) == [(1, 0), (2, 0)]
    l0 = singles[(singles["layer"] == 0)].iloc[0]
    assert l0["score_ci_low"] > 2.5


def test_cpr_and_cmd_against_a_hand_computed_curve():
    """x = n / 4: f = 0, 0.5, 1.2, 1 at x = 0, 0.25, 0.5, 1. CPR = 0.25 (0 + 0.5) / 2 +
    0.25 (0.5 + 1.2) / 2 + 0.5 (1.2 + 1) / 2 = 0.825. CMD: 0.25 (1 + 0.5) / 2, then the segment
    that crosses 1 at 0.5 / 0.7 of its width: 0.25 (0.5 (0.5 / 0.7) + 0.2 (0.2 / 0.7)) / 2,
    then 0.5 (0.2 + 0) / 2: 0.1875 + 0.0517857 + 0.05. The end points are added by definition
    when missing."""
    cpr, cmd = circ.cpr_cmd({0: 0.0, 1: 0.5, 2: 1.2, 4: 1.0}, 4)
    assert cpr == pytest.approx(0.825, abs=1e-12)
    assert cmd == pytest.approx(0.1875 + 0.25 * (0.5 * 0.5 / 0.7 + 0.2 * 0.2 / 0.7) / 2 + 0.05)
    assert circ.cpr_cmd({1: 0.5, 2: 1.2}, 4) == (cpr, cmd)
    assert circ.cpr_cmd({}, 4) == pytest.approx((0.5, 0.5))  # the diagonal
