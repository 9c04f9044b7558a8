"""Interventions: fast unit tests on a tiny random model with random SAEs. Each ablation kind is
checked against a hand-written hook, the circuit curves against their end points, and the stage's
tables against their schemas."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.dag import REPO
from helpers.schemas import check_outputs
from helpers.spliced import (
    D_MODEL,
    N_HEADS,
    N_LAYERS,
    SEQ,
    VOCAB,
    tiny_spliced,
)
from helpers.summaries import INDUCTION_SUMMARY

from circuitflow.attribution import scores as attr
from circuitflow.attribution import splice
from circuitflow.attribution.config import AttributionConfig
from circuitflow.batching import selection_half
from circuitflow.interventions import circuits, stats
from circuitflow.interventions import stage as iv_stage
from circuitflow.interventions.ablation import Intervener, Request
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.nodes import Node, component_nodes, hook_name

N_PROMPTS = 12


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return tiny_spliced(N_PROMPTS, frozen=True)


def tokens(prompts, col="clean_tokens"):
    return torch.tensor(np.stack(prompts[col].to_list()))


def logit_diff_with(model, prompts, hooks) -> np.ndarray:
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(tokens(prompts))
    ans = torch.tensor(prompts["answer_id"].to_numpy())
    dis = torch.tensor(prompts["distractor_id"].to_numpy())
    return splice.logit_diff(logits, ans, dis).numpy()


def cached(model, prompts, hook, col="clean_tokens"):
    _, cache = model.run_with_cache(tokens(prompts, col), names_filter=hook)
    return cache[hook]


def test_node_ids_match_the_attribution_graph():
    rows = [
        {"kind": "embedding", "layer": -1, "index": -1, "site": None},
        {"kind": "head", "layer": 1, "index": 3, "site": None},
        {"kind": "mlp", "layer": 0, "index": -1, "site": None},
        {"kind": "feature", "layer": 2, "index": 17, "site": "resid_post"},
        {"kind": "error", "layer": 1, "index": -1, "site": "resid_post"},
    ]
    nodes = [
        Node("embedding"),
        Node("head", 1, 3),
        Node("mlp", 0),
        Node("feature", 2, 17, "resid_post"),
        Node("error", 1, -1, "resid_post"),
    ]
    for row, node in zip(rows, nodes, strict=True):
        assert Node.of(row["kind"], row["layer"], row["index"], row["site"]) == node
        assert Node.parse(node.id) == node
    assert len(component_nodes(2, 4)) == 1 + 2 * (4 + 1)


def test_no_ablation_is_the_clean_model(tiny):
    model, _, prompts = tiny
    out = Intervener(model, prompts, "mean", batch_size=5).run(())
    np.testing.assert_allclose(out.logit_diff, logit_diff_with(model, prompts, []), atol=1e-5)
    assert out.correct.dtype == bool and len(out.mean_logits) == VOCAB


@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
def test_head_ablation_kinds_match_a_hand_written_hook(tiny, kind):
    """The ablated head's hook_z becomes 0, its position-wise mean over the clean prompts, or its
    value on a permuted corrupted prompt; other heads are untouched."""
    model, _, prompts = tiny
    hook, head = "blocks.1.attn.hook_z", 1
    if kind == "zero":
        value = torch.zeros_like(cached(model, prompts, hook))
    elif kind == "mean":
        value = cached(model, prompts, hook).mean(0, keepdim=True).expand(N_PROMPTS, -1, -1, -1)
    else:
        perm = np.random.default_rng([7, N_PROMPTS, SEQ]).permutation(N_PROMPTS)
        value = cached(model, prompts, hook, "corrupted_tokens")[torch.as_tensor(perm)]

    def manual(act, hook):
        act = act.clone()
        act[:, :, head] = value[:, :, head]
        return act

    expected = logit_diff_with(model, prompts, [(hook, manual)])
    out = Intervener(model, prompts, kind, batch_size=5).run([Node("head", 1, head)], seed=7)
    np.testing.assert_allclose(out.logit_diff, expected, atol=1e-5)
    assert not np.allclose(expected, logit_diff_with(model, prompts, []))


@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
def test_runs_stacked_in_one_pass_equal_runs_made_one_by_one(tiny, kind):
    """Copy k of a stacked pass carries run k's ablation and nothing else: heads, a whole MLP,
    features with the error term, steering and resample seeds, mixed in one pass."""
    model, saes, prompts = tiny
    hook = hook_name("resid_post", 0)
    vec = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(3))
    requests = [
        Request(frozenset({Node("head", 1, 1)}), seed=1),
        Request(frozenset({Node("head", 1, 1), Node("head", 0, 0)}), seed=2),
        Request(frozenset({Node("mlp", 0)}), seed=1),
        Request(),
        Request(
            frozenset({Node("feature", 0, 3, "resid_post"), Node("error", 0, -1, "resid_post")})
        ),
        Request(frozenset({Node("feature", 0, 5, "resid_post")}), steer=((hook, 2.0 * vec),)),
        Request(frozenset({Node("head", 1, 1)}), seed=2),
    ]

    def intervener(runs_per_pass):
        return Intervener(
            model, prompts, kind, batch_size=5, saes=saes, runs_per_pass=runs_per_pass
        )

    stacked = intervener(4)
    together = stacked.run_many(requests)
    alone = [intervener(1).run(r.nodes, r.seed, r.steer) for r in requests]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a.logit_diff, b.logit_diff, atol=1e-4)
        np.testing.assert_array_equal(a.top_token, b.top_token)
        np.testing.assert_allclose(a.mean_logits, b.mean_logits, atol=1e-4)
    assert len({tuple(o.logit_diff.round(4)) for o in together}) > 3  # the runs differ
    # 7 runs, 4 per pass: 2 passes over the 12 prompts (references excluded).
    ablated = stacked.counter.total() - reference_passes(stacked)
    assert ablated == 7 * N_PROMPTS


def reference_passes(iv) -> float:
    """Forward equivalents spent on reference activations (means, corrupted prompts)."""
    return sum(len(v) for k, v in iv._ref.items() if k[0] == "acts")


def test_mean_reference_corrupted_and_whole_components(tiny):
    model, _, prompts = tiny
    hook = "blocks.0.hook_mlp_out"
    value = cached(model, prompts, hook, "corrupted_tokens").mean(0, keepdim=True)

    def manual(act, hook):
        return value.expand_as(act).clone()

    expected = logit_diff_with(model, prompts, [(hook, manual)])
    out = Intervener(model, prompts, "mean", "corrupted").run([Node("mlp", 0)])
    np.testing.assert_allclose(out.logit_diff, expected, atol=1e-5)


def test_feature_ablation_equals_a_spliced_sae_with_the_feature_replaced(tiny):
    """x + (0 - a_f) W_dec[f] is the SAE splice (error term kept) with feature f zeroed."""
    model, saes, prompts = tiny
    hook = hook_name("resid_post", 0)
    sae = saes[hook]
    acts = sae.encode(cached(model, prompts, hook))
    f = int(acts.flatten(0, 1).gt(0).sum(0).argmax())  # a feature that fires
    groups = splice.build_groups(N_LAYERS, [("resid_post", 0)])

    def zero_f(feats):
        feats = feats.clone()
        feats[..., f] = 0
        return feats

    with torch.no_grad():
        run = splice.forward(
            model, tokens(prompts), groups, {hook: sae}, {hook + ".sae:feats": zero_f}
        )
    ans, dis = (torch.tensor(prompts[c].to_numpy()) for c in ("answer_id", "distractor_id"))
    expected = splice.logit_diff(run.logits, ans, dis).numpy()
    node = Node("feature", 0, f, "resid_post")
    out = Intervener(model, prompts, "zero", saes=saes).run([node])
    np.testing.assert_allclose(out.logit_diff, expected, atol=1e-4)


@pytest.mark.parametrize("kind", ["zero", "mean"])
def test_feature_set_and_error_ablation_equal_one_spliced_forward(tiny, kind):
    """Several features and the error term of one SAE ablated together are the SAE splice with
    those features and the error replaced (one encode, not one per feature); every feature and
    the error ablated together replace the activation by its reference."""
    model, saes, prompts = tiny
    hook = hook_name("resid_post", 1)
    sae = saes[hook]
    x = cached(model, prompts, hook)
    acts = sae.encode(x)
    fired = acts.flatten(0, 1).gt(0).sum(0)
    feats = [int(f) for f in fired.argsort(descending=True)[:3]]
    error = x - sae.decode(acts)
    ref_feats = 0 if kind == "zero" else acts.mean(0, keepdim=True)
    ref_error = 0 if kind == "zero" else error.mean(0, keepdim=True)

    def set_feats(f):
        f = f.clone()
        f[..., feats] = (ref_feats + 0 * f)[..., feats]
        return f

    def set_error(e):
        return (ref_error + 0 * e).to(e.dtype)

    groups = splice.build_groups(N_LAYERS, [("resid_post", 1)])
    patches = {hook + ".sae:feats": set_feats, hook + ".sae:error": set_error}
    with torch.no_grad():
        run = splice.forward(model, tokens(prompts), groups, {hook: sae}, patches)
    ans, dis = (torch.tensor(prompts[c].to_numpy()) for c in ("answer_id", "distractor_id"))
    expected = splice.logit_diff(run.logits, ans, dis).numpy()
    nodes = [Node("feature", 1, f, "resid_post") for f in feats] + [
        Node("error", 1, -1, "resid_post")
    ]
    iv_ = Intervener(model, prompts, kind, saes=saes)
    np.testing.assert_allclose(iv_.run(nodes).logit_diff, expected, atol=1e-4)
    assert not np.allclose(expected, logit_diff_with(model, prompts, []), atol=1e-3)

    everything = [Node("feature", 1, f, "resid_post") for f in range(sae.cfg.d_sae)]
    everything.append(Node("error", 1, -1, "resid_post"))
    value = torch.zeros_like(x) if kind == "zero" else x.mean(0, keepdim=True).expand_as(x)
    whole = logit_diff_with(model, prompts, [(hook, lambda act, hook: value.clone())])
    np.testing.assert_allclose(iv_.run(everything).logit_diff, whole, atol=1e-4)


def test_ranked_nodes_mix_components_features_and_errors():
    """Ranked by the selection half's score (`score`, over every prompt, would order the
    embedding first: ranking by it would let the held-out half choose the circuit)."""
    components = pd.DataFrame(
        {"kind": ["embedding", "head", "mlp"], "layer": [-1, 0, 0], "index": [-1, 1, -1],
         "score": [50.0, -3.0, 0.0], "score_selection": [0.5, -3.0, 0.0]}
    )  # fmt: skip
    features = pd.DataFrame(
        {"site": ["resid_post"] * 3, "layer": [0, 0, 0], "feature": [4, 7, -1],
         "kind": ["feature", "feature", "error"], "score": [0.0, 0.0, 0.0],
         "score_selection": [2.0, 9.0, 0.25]}
    )  # fmt: skip
    # Feature 7 is scored but does not fire on the prompts; feature 5 fires but is unscored.
    active = {("resid_post", 0): np.array([4, 5])}
    ranked = circuits.ranked_nodes(components, features, active)
    assert [n.id for n in ranked] == [
        "head.0.1", "feature.resid_post.0.4", "embedding", "error.resid_post.0", "mlp.0",
        "feature.resid_post.0.5",
    ]  # fmt: skip
    assert circuits.ranked_nodes(components) == ranked[:1] + ranked[2:3] + ranked[4:5]
    graph = {"nodes": [{"id": "head.0.1"}, {"id": "feature.resid_post.0.5"}, {"id": "logit"}]}
    assert [n.id for n in circuits.graph_nodes(graph, ranked)] == [
        "head.0.1",
        "feature.resid_post.0.5",
    ]


def test_steering_adds_the_vector_after_bos(tiny):
    model, _, prompts = tiny
    hook = "blocks.0.hook_resid_post"
    vec = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(1))

    def manual(act, hook):
        act = act.clone()
        act[:, 1:] += 3.0 * vec
        return act

    expected = logit_diff_with(model, prompts, [(hook, manual)])
    out = Intervener(model, prompts, "mean").run((), steer=[(hook, 3.0 * vec)])
    np.testing.assert_allclose(out.logit_diff, expected, atol=1e-5)


def test_circuit_curves_split_the_prompts_and_match_random_circuits_by_kind(tiny):
    """Faithfulness on each half against the Intervener's own runs restricted to that half;
    random circuits with the top circuit's make-up; the same numbers on a rerun; resample
    ablation differs between seeds."""
    model, saes, prompts = tiny
    cfg = InterventionsConfig(n_random_circuits=3, n_seeds=2)
    ranked = component_nodes(N_LAYERS, N_HEADS)
    ranked = [ranked[3], ranked[0], ranked[5], *ranked[1:3], ranked[4], *ranked[6:]]
    sizes = circuits.circuit_sizes(len(ranked), cfg, [])
    selection = selection_half(prompts)
    assert 0 < selection.sum() < len(prompts)

    def curves():
        runs = stats.Runs(Intervener(model, prompts, "mean"), stats.seeds_for(cfg, 0))
        return circuits.circuit_curves(runs, ranked, sizes, cfg, 0, selection)

    c = curves()
    iv = Intervener(model, prompts, "mean")
    full, empty = iv.run(()).logit_diff, iv.run(ranked).logit_diff
    for n in (2, 4):
        kept = iv.run(ranked[n:]).logit_diff  # everything but the top-n circuit ablated
        rand = c[(c["circuit"] == "random") & (c["n"] == n)]
        assert len(rand) == 3
        for nodes in rand["nodes"]:
            kinds = sorted(Node.parse(i).kind for i in nodes)
            assert kinds == sorted(node.kind for node in ranked[:n])
        row = c[(c["circuit"] == "top") & (c["n"] == n)].iloc[0]
        for mask, column in ((~selection, "faithfulness_heldout"), (selection, "m_circuit")):
            m_full, m_empty, m_c = (x[mask].mean() for x in (full, empty, kept))
            if column == "m_circuit":
                # One seed's bootstrap resample of the selection half: near the half's mean.
                assert row["m_full"] == pytest.approx(m_full, abs=0.5 * abs(m_full) + 0.1)
                continue
            whole = rand.iloc[0]  # random circuits: the whole half, not a resample
            pick = [Node.parse(i) for i in whole["nodes"]]
            kept_r = iv.run([x for x in ranked if x not in pick]).logit_diff[mask].mean()
            expected = (kept_r - m_empty) / (m_full - m_empty)
            assert whole[column] == pytest.approx(expected, rel=1e-6)
    pd.testing.assert_frame_equal(c, curves())

    resample = stats.Runs(Intervener(model, prompts, "resample"), [0, 1])
    a, b = resample.get([Node("mlp", 0)], 0), resample.get([Node("mlp", 0)], 1)
    assert not np.allclose(a.logit_diff, b.logit_diff)
    eff = resample.effect([Node("mlp", 0)], 0.95)
    assert eff["score_ci_low"] <= eff["score_ci_high"] and eff["score_std"] > 0


def test_faithfulness_auc_is_the_mean_over_log_size():
    n = np.array([0, 1, 2, 4, 8, 16])
    top = pd.DataFrame({"circuit": "top", "n": n})
    always = top.assign(faithfulness=1.0)
    assert circuits.faithfulness_auc(always, 16, "faithfulness") == pytest.approx(1.0)
    # Linear in log n from 0 at n = 1 to 1 at n = 16: half the area.
    linear = top.assign(faithfulness=np.log(np.maximum(n, 1)) / np.log(16))
    assert circuits.faithfulness_auc(linear, 16, "faithfulness") == pytest.approx(0.5)
    late = top.assign(faithfulness=(n >= 16).astype(float))  # faithful only when whole
    assert circuits.faithfulness_auc(late, 16, "faithfulness") == pytest.approx(0.125)


def test_statistics():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    low, high, p = stats.t_interval(x, 0.95)
    assert low < 2.5 < high and 0 < p < 0.05
    assert stats.t_interval(np.zeros(5), 0.95) == (0.0, 0.0, 1.0)
    np.testing.assert_array_equal(stats.bootstrap_rows(10, 3), stats.bootstrap_rows(10, 3))
    assert not np.array_equal(stats.bootstrap_rows(50, 3), stats.bootstrap_rows(50, 4))


def test_stage_writes_tables_figures_and_summary(tiny, tmp_path):
    model, saes, prompts = tiny
    acfg = AttributionConfig(method="atp", validation_features=0)
    scores = attr.score_nodes(model, prompts, saes, acfg)
    frame = attr.with_score(scores.frame, "atp")
    adir = tmp_path / "attribution" / "b"
    adir.mkdir(parents=True)
    attr.heads_table(frame).to_parquet(adir / "heads.parquet")
    attr.components_table(frame).to_parquet(adir / "components.parquet")
    attr.features_table(frame).to_parquet(adir / "features.parquet")
    graph = {"nodes": [{"id": "head.0.1", "kind": "head"}, {"id": "mlp.1", "kind": "mlp"},
                       {"id": "logit", "kind": "logit"}]}  # fmt: skip
    (adir / "graph.json").write_text(json.dumps(graph))
    cfg = InterventionsConfig(
        n_seeds=2, n_random_circuits=3, top_k_heads=3, n_random_sets=2, n_features=2,
        n_random_features=2, steering_alphas=(-2.0, 0.0, 2.0),
    )  # fmt: skip
    out = tmp_path / "interventions" / "b"
    summary = iv_stage.intervene(model, prompts, adir, saes, None, cfg, "b", out, base_seed=0)
    # Candidates: every component, the features that fire, both error terms.
    kinds = summary["n_nodes_by_kind"]
    assert kinds["head"] == N_LAYERS * N_HEADS and kinds["mlp"] == N_LAYERS
    assert kinds["error"] == N_LAYERS and 0 < kinds["feature"] <= N_LAYERS * 32
    assert summary["n_nodes"] == sum(kinds.values())
    # No size configured: the smallest faithful one on the selection half, and how it does on
    # the held-out half, read from the curves table.
    n = summary["smallest_faithful_size"]
    assert summary["circuit_size"] == n
    assert summary["circuit_size_source"] == "smallest faithful on the selection half"
    assert len(summary["circuit"]) == n == sum(summary["smallest_faithful_by_kind"].values())
    halves = (summary["n_prompts_selection"], summary["n_prompts_heldout"])
    assert halves == (N_PROMPTS // 2, N_PROMPTS // 2)
    assert summary["graph_circuit"]["nodes"] == ["head.0.1", "mlp.1"]
    on_disk = check_outputs(out, N_LAYERS, N_HEADS)
    assert on_disk["faithfulness"] == pytest.approx(summary["faithfulness"])
    table = pd.read_parquet(out / "circuits.parquet")
    at_n = table[(table["circuit"] == "top") & (table["n"] == n)].iloc[0]
    assert summary["faithfulness_heldout"] == pytest.approx(at_n["faithfulness_heldout"])
    assert summary["completeness_heldout"] == pytest.approx(at_n["completeness_heldout"])
    assert summary["faithfulness_auc"] == pytest.approx(
        circuits.faithfulness_auc(table, summary["n_nodes"], "faithfulness_heldout")
    )
    assert (table[table["circuit"] == "random"]["n"] == n).sum() == cfg.n_random_circuits
    assert (table["circuit"] == "graph").sum() == 1
    # The flags are the summary's own numbers judged (flags.py), the same from summary.json,
    # and the report's page lists each.
    from circuitflow.interventions.flags import flags_of
    from circuitflow.report.pages.behaviour import behaviour_sections

    written = json.loads((out / "summary.json").read_text())
    for key, control in (("completeness", "random_completeness"),
                         ("faithfulness_heldout", "random_faithfulness_heldout")):  # fmt: skip
        reaches = summary[control] >= summary[key]
        assert summary["random_reaches_circuit"][key] is reaches
    below = summary["faithfulness_heldout"] < cfg.faithfulness_threshold
    assert summary["below_threshold"]["faithfulness_heldout"] is below
    assert written["flags"] == flags_of(written) == summary["flags"]
    page = html.unescape("".join(body for _, body in behaviour_sections(adir, out)))
    assert summary["flags"] and all(f["text"] in page for f in summary["flags"])

    # No size reaches the threshold: no circuit, and nothing claims a faithfulness.
    never = InterventionsConfig(**(asdict(cfg) | {"faithfulness_threshold": 100.0}))
    none = iv_stage.intervene(model, prompts, adir, saes, None, never, "b", tmp_path / "n", 0)
    assert none["circuit_size"] is None and none["circuit"] is None
    assert none["smallest_faithful_size"] is None
    assert none["faithfulness"] is None and none["faithfulness_heldout"] is None
    assert none["circuit_size_source"].startswith("none: no circuit size reaches")
    from circuitflow.report.pages.behaviour import behaviour_sections

    page = str(behaviour_sections(adir, tmp_path / "n"))
    assert "none: no circuit size is faithful" in page

    # Components only, a configured size.
    only = InterventionsConfig(**(asdict(cfg) | {"circuit_nodes": "components",
                                                    "circuit_size": 2}))  # fmt: skip
    small = iv_stage.intervene(model, prompts, adir, saes, None, only, "b", tmp_path / "c", 0)
    assert small["n_nodes"] == 1 + N_LAYERS * (N_HEADS + 1)
    assert small["circuit_size"] == 2 and small["circuit_size_source"] == "config"

    # The component circuit beside the feature circuit: what a components-only run finds as
    # its smallest faithful circuit, with the same numbers; the report leads with both.
    alone = InterventionsConfig(**(asdict(cfg) | {"circuit_nodes": "components"}))
    comps = iv_stage.intervene(model, prompts, adir, saes, None, alone, "b", tmp_path / "a", 0)
    beside = summary["component_circuit"]
    assert beside["candidates"] == comps["n_nodes"] == 1 + N_LAYERS * (N_HEADS + 1)
    assert beside["size"] == comps["smallest_faithful_size"] is not None
    assert beside["nodes"] == comps["smallest_faithful_circuit"]
    for key in ("faithfulness", "faithfulness_heldout", "completeness_heldout",
                "random_faithfulness_heldout"):  # fmt: skip
        assert beside[key] == pytest.approx(comps[key]), key
    assert comps["component_circuit"]["faithfulness_heldout"] == comps["faithfulness_heldout"]
    # Its random controls are drawn at that size only (what interventions.plan charges), and
    # none where it is every candidate (ranked by mean-ablation score on this random model,
    # no fewer components are faithful on the selection half).
    table = pd.read_parquet(out / "component_circuits.parquet")
    controlled = {beside["size"]} if 0 < beside["size"] < beside["candidates"] else set()
    assert set(table[table["circuit"] == "random"]["n"]) == controlled
    sections = behaviour_sections(adir, out)
    views = next(body for title, body in sections if title.startswith("Two views of the circuit"))
    for key in ("ablation_circuit", "patching_circuit"):
        assert f"{summary[key]['cpr']:.3f}" in views and f"{summary[key]['cmd']:.3f}" in views
    lead = sections[0]
    assert lead[0].startswith("Circuits, held out beside selection")
    assert f"{beside['faithfulness_heldout']:.3f}" in lead[1]
    assert f"{summary['faithfulness_heldout']:.3f}" in lead[1]
    sets = pd.read_parquet(out / "head_sets.parquet")
    assert (sets[sets["set"] == "top_k"]["size"].value_counts().sort_index() == [3, 1]).all()

    # The same stage again: the seeds give the same numbers.
    again = tmp_path / "again"
    iv_stage.intervene(model, prompts, adir, saes, None, cfg, "b", again, base_seed=0)
    for name in ("heads", "circuits", "head_sets", "features", "steering"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(out / f"{name}.parquet"), pd.read_parquet(again / f"{name}.parquet")
        )

    # The cross-behaviour table, through the script's command line.
    table, fig = tmp_path / "across.parquet", tmp_path / "across.png"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "interventions.py"), "across",
         "--behaviours", "b", "c", "--heads", str(out / "heads.parquet"),
         str(again / "heads.parquet"), "--out", str(table), "--out-figure", str(fig)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    across = pd.read_parquet(table)
    assert {"behaviour", "layer", "head", "score", "drop_frac", "specificity"} <= set(across)
    assert len(across) == 2 * N_LAYERS * N_HEADS
    assert across["specificity"].abs().max() < 1e-9  # the same table twice
    assert fig.stat().st_size > 1000


def test_script_help_and_bad_config():
    script = str(REPO / "scripts" / "interventions.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "behaviour" in done.stdout
    with pytest.raises(ValueError, match="unknown key interventions.ablate; allowed keys"):
        InterventionsConfig.from_dict({"ablate": "zero"})
    with pytest.raises(ValueError, match="allowed values"):
        Intervener(None, pd.DataFrame(), "median")


INDUCTION = INDUCTION_SUMMARY


def test_flags_on_headline_numbers():
    """Every random control that reaches its circuit's value and every faithfulness under the
    threshold is flagged, once; nothing else is; summary.json's round trip (string curve keys)
    flags the same; a summary with no faithful size flags only what it has."""
    from circuitflow.interventions import flags

    s = flags.with_flags(INDUCTION)
    assert s["random_reaches_circuit"] == {
        "faithfulness": False, "completeness": True, "faithfulness_heldout": False,
        "completeness_heldout": True, "faithfulness_at_smallest": False,
    }  # fmt: skip
    assert s["below_threshold"] == {
        "faithfulness": False, "faithfulness_heldout": True,
        "graph_circuit.faithfulness": True, "graph_circuit.faithfulness_heldout": True,
    }  # fmt: skip
    found = {(f["kind"], f["key"]): f for f in s["flags"]}
    assert set(found) == {
        ("random_reaches_circuit", "completeness"),
        ("random_reaches_circuit", "completeness_heldout"),
        ("below_threshold", "faithfulness_heldout"),
        ("below_threshold", "graph_circuit.faithfulness"),
        ("below_threshold", "graph_circuit.faithfulness_heldout"),
    }
    held = found[("below_threshold", "faithfulness_heldout")]
    assert (held["value"], held["reference"]) == (0.751, 0.8)
    assert held["text"] == "the circuit's held-out faithfulness 0.751 is under the " \
        "faithfulness threshold 0.8"  # fmt: skip
    complete = found[("random_reaches_circuit", "completeness")]
    assert complete["reference_key"] == "random_completeness"
    assert "(1.01 against 0.994): completeness does not tell" in complete["text"]
    assert flags.flags_of(json.loads(json.dumps(INDUCTION))) == s["flags"]
    # A configured size: the smallest faithful circuit's own control is flagged apart.
    configured = INDUCTION | {"circuit_size": 369, "random_faithfulness_at_smallest": 0.9}
    keys = {f["key"] for f in flags.flags_of(configured)}
    assert "faithfulness_at_smallest" in keys
    # No faithful size: the metrics at it are null, neither flagged nor a crash.
    none = INDUCTION | dict.fromkeys(
        ["circuit_size", "smallest_faithful_size", "faithfulness", "completeness",
         "faithfulness_heldout", "completeness_heldout", "random_faithfulness",
         "random_completeness", "random_faithfulness_heldout", "random_completeness_heldout",
         "random_faithfulness_at_smallest"]
    )  # fmt: skip
    s = flags.with_flags(none)
    assert set(s["random_reaches_circuit"].values()) == {None}
    assert {f["key"] for f in s["flags"]} == {
        "graph_circuit.faithfulness", "graph_circuit.faithfulness_heldout"
    }  # fmt: skip


def test_inert_heads_are_left_out_of_the_top_heads_and_head_sets(tmp_path):
    """A pruned head (W_O = 0, as the embedded model prunes 5 of its 8) scores exactly 0 in
    attribution and in ablation: it carries no difference (`no_difference_heads`) and is inert
    (`inert_heads`: its own ablation has no effect), so it is left out of both stages' top
    heads (`left_out_heads`), of the heads whose pairs and triplets are ablated and of the
    report's head tables (which name it), so the sets are not the live sets again with a dead
    head added."""
    from circuitflow.attribution import stage as attr_stage
    from circuitflow.report.pages.behaviour import behaviour_sections

    torch.set_num_threads(1)
    model, saes, prompts = tiny_spliced(N_PROMPTS, frozen=True)
    with torch.no_grad():
        model.blocks[0].attn.W_O[1] = 0.0
    adir, out = tmp_path / "attribution", tmp_path / "interventions"
    acfg = AttributionConfig(method="atp", validation_features=2, context_features=1,
                             n_contexts=2, max_graph_nodes=6)  # fmt: skip
    attr_summary = attr_stage.attribute(model, prompts, saes, None, acfg, "b", adir)
    heads = pd.read_parquet(adir / "heads.parquet").set_index(["layer", "head"])
    assert heads.loc[(0, 1), "score"] == 0 and (heads["score"] != 0).sum() == 3
    assert attr_summary["no_difference_heads"] == ["L0H1"]
    assert [(h["layer"], h["head"]) for h in attr_summary["top_heads"]] == [
        h for h in heads.index if h != (0, 1)
    ]
    cfg = InterventionsConfig(n_seeds=1, n_random_circuits=1, circuit_nodes="components",
                              top_k_heads=4, n_random_sets=1, n_features=1,
                              n_random_features=1, steering_alphas=(0.0, 2.0))  # fmt: skip
    s = iv_stage.intervene(model, prompts, adir, saes, None, cfg, "b", out, base_seed=0)
    singles = pd.read_parquet(out / "heads.parquet").set_index(["layer", "head"])
    assert singles.loc[(0, 1), "score"] == 0  # ablating it changes nothing
    assert s["no_difference_heads"] == s["left_out_heads"] == ["L0H1"]
    # Inert: no effect of its own ablation that the prompts can tell from 0 (on this random
    # model, with 12 prompts, the live heads' intervals cover 0 too).
    inert = singles[(singles["score_ci_low"] <= 0) & (singles["score_ci_high"] >= 0)]
    assert "L0H1" in s["inert_heads"]
    assert s["inert_heads"] == [f"L{la}H{h}" for la, h in sorted(inert.index)]
    assert s["top_k_heads"] == [f"L{la}H{h}" for la, h in heads.index if (la, h) != (0, 1)]
    assert all((h["layer"], h["head"]) != (0, 1) for h in s["top_heads"])
    sets = pd.read_parquet(out / "head_sets.parquet")
    top_k = sets[sets["set"] == "top_k"]
    assert len(top_k) == 3 + 1  # the pairs and the triplet of the 3 live heads
    assert not top_k["heads"].str.contains("L0H1").any()
    page = "".join(body for _, body in behaviour_sections(adir, out))
    assert "whose score is exactly 0 (such as pruned heads) are not shown: L0H1" in page
    assert "whose ablation effect is exactly 0" in page
    assert "heads inert and carrying no difference left out: L0H1" in page


def test_script_reports_no_faithful_circuit(tiny_hf_model_dir, tmp_path):
    """No circuit size reaching the threshold is a result, not a crash, through the scripts
    (benchmarks/scale.py on GPT-2-small's architecture with random weights had ended in
    `TypeError: unsupported format string passed to NoneType.__format__`): the interventions
    script writes summary.json with circuit_size null and says so, and the report's pages of
    that summary (tables and the graph page) say so too."""
    from circuitflow.attribution import stage as attr_stage
    from circuitflow.io import write_json
    from circuitflow.model.load import prefetch

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    write_json(model_dir / "model.json", prefetch(str(tiny_hf_model_dir)))
    rng = np.random.default_rng(0)
    clean = rng.integers(1, 600, size=(10, 8))
    corrupted = clean.copy()
    corrupted[:, :4] = rng.integers(1, 600, size=(10, 4))
    prompts = pd.DataFrame({"prompt_id": range(10), "clean_tokens": list(clean),
                            "corrupted_tokens": list(corrupted),
                            "answer_id": rng.integers(1, 600, 10),
                            "distractor_id": rng.integers(1, 600, 10)})  # fmt: skip
    prompts.to_parquet(tmp_path / "prompts.parquet")
    config = {"device": "cpu", "seed": 0,
              "attribution": {"method": "atp", "validation_prompts": 4},
              "interventions": {"n_seeds": 2, "n_random_circuits": 2, "n_random_sets": 1,
                                "faithfulness_threshold": 50.0}}  # fmt: skip
    adir, out = tmp_path / "attribution" / "b", tmp_path / "interventions" / "b"
    model_json = model_dir / "model.json"
    attr_stage.run(config, "b", tmp_path / "prompts.parquet", model_json, [], [], adir)

    def script(name: str, *args) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, str(REPO / "scripts" / name), *map(str, args)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    prompts_path = tmp_path / "prompts.parquet"
    done = script("interventions.py", "behaviour", "--config", json.dumps(config), "--behaviour",
                  "b", "--prompts", prompts_path, "--model-json", model_json,
                  "--attribution-dir", adir, "--out-dir", out)  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert max(summary["faithfulness_curve"].values()) < 50.0  # the case: no size is faithful
    assert summary["circuit_size"] is None and summary["faithfulness"] is None
    assert summary["component_circuit"]["size"] is None
    assert (
        "b: no component circuit is faithful; no circuit size reaches faithfulness 50.0 on the "
        "selection half" in done.stdout
    )
    report = tmp_path / "report"
    script("report.py", "behaviour", "--behaviour", "b", "--attribution-dir", adir,
           "--interventions-dir", out, "--out-html", report / "tables.html",
           "--out-graph", report / "graph.html")  # fmt: skip
    tables = (report / "tables.html").read_text()
    assert "none: no circuit size is faithful on the selection half" in tables
    graph_page = (report / "graph.html").read_text()
    assert "found no faithful circuit size" in graph_page
