"""Attribution: fast unit tests on a tiny random model with random SAEs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.spliced import D_SAE, N_HEADS, N_LAYERS, tiny_spliced

from circuitflow.attribution import graph as circuit_graph
from circuitflow.attribution import methods, splice
from circuitflow.attribution import scores as attr
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.methods import atp, ig
from circuitflow.nodes import Node, hook_name, site_layer


@pytest.fixture(scope="module")
def tiny():
    return tiny_spliced(8)


def test_splice_keeps_clean_logits_and_matches_sae_lens(tiny):
    model, saes, prompts = tiny
    tokens = torch.tensor(np.stack(prompts["clean_tokens"]))
    groups = splice.build_groups(N_LAYERS, [("resid_post", 0), ("resid_post", 1)])
    with torch.no_grad():
        plain = model(tokens)
        ours = splice.forward(model, tokens, groups, saes)
        with splice.sae_lens_spliced(model, saes) as hooked:
            lens_logits, cache = hooked.run_with_cache(tokens)
    torch.testing.assert_close(ours.logits, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lens_logits, plain, atol=1e-5, rtol=1e-5)
    for hook in saes:
        feats = ours.acts[hook + ".sae:feats"]
        assert (feats > 0).any()
        torch.testing.assert_close(feats, cache[hook + ".hook_sae_acts_post"], atol=1e-5, rtol=1e-5)


def test_splice_keeps_gradients_of_the_plain_model(tiny):
    """With the error term in the graph, upstream gradients equal the unspliced model's."""
    model, saes, prompts = tiny
    b = next(splice.iter_batches(prompts, 8, "cpu"))
    groups = splice.build_groups(N_LAYERS, [("resid_post", 0), ("resid_post", 1)])
    plain_groups = splice.build_groups(N_LAYERS, [])
    grads = []
    for gs, s in ((groups, saes), (plain_groups, {})):
        run = splice.forward(model, b.clean, gs, s)
        m = splice.logit_diff(run.logits, b.answer, b.distractor).sum()
        grads.append(torch.autograd.grad(m, run.acts["blocks.0.attn.hook_z"])[0])
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", list(methods.REGISTRY))
def test_fast_methods_agree_with_exact_patching_kind_by_kind(tiny, method):
    """Every feature of both SAEs patched exactly: the fast scores rank features (and the whole
    node set) as exact patching does. The features the corruption does not move where the
    metric can see them (on the last SAE, whose features reach the logits at their own position
    only: at the last position; before it: anywhere) cannot move the metric: they are left out
    of the agreement (`n_inert`), and they are exactly those."""
    model, saes, prompts = tiny
    every = N_LAYERS * D_SAE
    cfg = AttributionConfig(method=method, ig_steps=16, validation_features=every, batch_size=4)
    scores = attr.score_nodes(model, prompts, saes, cfg)
    frame = scores.frame
    assert {"head", "mlp", "embedding", "feature", "error"} <= set(frame["kind"])
    assert frame["score_exact"].notna().all()
    val = attr.validation(frame, method, 0.8)
    sp = splice.Spliced.of(model, saes)
    batch = next(splice.iter_batches(prompts, len(prompts), "cpu"))
    clean, corr = sp.acts(batch.clean), sp.acts(batch.corrupted)
    last = hook_name("resid_post", N_LAYERS - 1) + ".sae:feats"
    seen = {k: v[:, -1:] if k == last else v for k, v in clean.items()}
    silent = sum(
        int((seen[k] == corr[k][:, -seen[k].shape[1] :]).all(1).all(0).sum())
        for k in clean
        if k.endswith(":feats")
    )
    assert 0 < silent < every  # the case is there
    assert val["by_kind"]["feature"]["n_inert"] == silent
    assert val["by_kind"]["feature"]["n_nodes"] == every - silent
    assert val["by_kind"]["feature"]["spearman"] >= 0.85, val
    assert val["spearman"] >= 0.85 and val["passed"] is True
    # Embedding patch = the whole clean - corrupted difference.
    emb = frame[frame["kind"] == "embedding"].iloc[0]
    assert emb["score_exact"] == pytest.approx(
        scores.metric_clean - scores.metric_corrupted, abs=1e-4
    )


def test_validation_compares_fast_and_exact_scores_on_the_same_prompts(tiny):
    """Exact patching runs on the validation prompts only, so `validation` ranks the fast
    method's scores over those prompts (`score_<method>_validation`), not over all of them:
    they equal a separate run on the validation prompts alone."""
    model, saes, prompts = tiny
    cfg = AttributionConfig(
        method="atp", validation_prompts=4, validation_features=N_LAYERS * D_SAE
    )
    frame = attr.score_nodes(model, prompts, saes, cfg).frame
    subset = attr.validation_prompts(prompts, cfg)
    assert 0 < len(subset) < len(prompts)
    alone = attr.score_nodes(model, subset, saes, cfg).frame
    np.testing.assert_allclose(frame["score_atp_validation"], alone["score_atp"], atol=1e-6)
    np.testing.assert_allclose(frame["score_exact"], alone["score_exact"], atol=1e-6)
    assert not np.allclose(frame["score_atp"], alone["score_atp"], atol=1e-3)
    fast, exact = alone["score_atp"].to_numpy(), alone["score_exact"].to_numpy()
    moves = (fast != 0) | (exact != 0)  # inert nodes (both exactly 0) are left out
    expected = attr.spearman(fast[moves], exact[moves])
    assert attr.validation(frame, "atp", 0.8)["spearman"] == pytest.approx(expected)


def _linear_scores(model, saes, prompts, method: str, steps: int = 0) -> dict:
    """The fast method's scores before direct.py's exact direct effects, per key, mean over
    prompts (one batch)."""
    sp = splice.Spliced.of(model, saes)
    batch = next(splice.iter_batches(prompts, len(prompts), "cpu"))
    corr = sp.acts(batch.corrupted)
    if method == "atp":
        scores = atp.atp_batch(sp, batch, corr, exact_direct=False)[0]
    else:
        with torch.no_grad():
            run = sp.run(batch.clean)
        clean = {k: v.detach() for k, v in run.acts.items()}
        scores = ig.ig_batch(sp, batch, clean, corr, run.final, steps, exact_direct=False)[0]
    return {k: v.mean(0).detach() for k, v in scores.items()}


def test_feature_scores_follow_the_chain_rule(tiny):
    """AtP of feature f at an SAE, before its direct part is made exact, = sum over positions of
    (W_dec[f] . dm/dx)(f_clean - f_corr), with dm/dx the plain model's gradient at the SAE's hook
    (the splice leaves the model's function unchanged): computed here with TransformerLens's own
    hooks, not the splice."""
    model, saes, prompts = tiny
    hook = hook_name("resid_post", 0)
    sae = saes[hook]
    clean, corr = (torch.tensor(np.stack(prompts[c])) for c in ("clean_tokens", "corrupted_tokens"))
    ans, dis = (torch.tensor(prompts[c].to_numpy()) for c in ("answer_id", "distractor_id"))
    store = {}

    def keep(act, hook):
        store["x"] = act.detach().requires_grad_(True)
        return store["x"]

    with torch.enable_grad(), model.hooks(fwd_hooks=[(hook, keep)]):
        logits = model(clean)
        splice.logit_diff(logits, ans, dis).sum().backward()
    x, grad = store["x"].detach(), store["x"].grad
    _, cache = model.run_with_cache(corr, names_filter=hook)
    delta = sae.encode(x) - sae.encode(cache[hook])
    expected = (torch.einsum("bpd,fd->bpf", grad, sae.W_dec) * delta).sum((0, 1)) / len(prompts)
    ours = _linear_scores(model, saes, prompts, "atp")[hook + ".sae:feats"]
    assert expected.abs().max() > 1e-3  # features that move the metric
    np.testing.assert_allclose(ours.numpy(), expected.detach().numpy(), atol=1e-5, rtol=1e-4)


def test_ig_integrates_along_the_activation_path(tiny):
    """IG (before its direct part is made exact) moves every node on its own straight line: at
    the last SAE, whose output reaches the
    logits through the final norm alone, the spliced residual is then clean + alpha (corrupted
    - clean) exactly, so feature f's score is the mean over midpoints of W_dec[f] . dm/dx at
    that residual, times f_clean - f_corr, summed over positions: computed here with
    TransformerLens's own hooks, not the splice. (Moving the embedding instead and recomputing
    the rest, the last residual leaves that line and the scores differ.)"""
    model, saes, prompts = tiny
    steps = 5
    hook = hook_name("resid_post", N_LAYERS - 1)
    sae = saes[hook]
    clean, corr = (torch.tensor(np.stack(prompts[c])) for c in ("clean_tokens", "corrupted_tokens"))
    ans, dis = (torch.tensor(prompts[c].to_numpy()) for c in ("answer_id", "distractor_id"))
    x_clean = model.run_with_cache(clean, names_filter=hook)[1][hook]
    x_corr = model.run_with_cache(corr, names_filter=hook)[1][hook]
    grad = torch.zeros_like(x_clean)
    for i in range(steps):
        x = (x_clean + (i + 0.5) / steps * (x_corr - x_clean)).requires_grad_(True)
        with torch.enable_grad(), model.hooks(fwd_hooks=[(hook, lambda act, hook, x=x: x)]):
            metric = splice.logit_diff(model(clean), ans, dis).sum()
            grad += torch.autograd.grad(metric, x)[0] / steps
    delta = sae.encode(x_clean) - sae.encode(x_corr)
    expected = (torch.einsum("bpd,fd->bpf", grad, sae.W_dec) * delta).sum((0, 1)) / len(prompts)
    ours = _linear_scores(model, saes, prompts, "ig", steps)[hook + ".sae:feats"]
    assert expected.abs().max() > 1e-3  # features that move the metric
    np.testing.assert_allclose(ours.numpy(), expected.detach().numpy(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", list(methods.REGISTRY))
def test_last_layer_features_score_their_exact_effect(tiny, method):
    """A feature of the SAE on the last resid_post reaches the metric only through the final
    norm, so with its direct part exact (direct.py) both fast methods give its patching effect:
    the metric drop when the last residual moves by W_dec[f] (f_corr - f_clean), computed here
    with TransformerLens's own hooks. (A gradient alone misses the norm's curvature.)"""
    model, saes, prompts = tiny
    hook = hook_name("resid_post", N_LAYERS - 1)
    sae = saes[hook]
    clean, corr = (torch.tensor(np.stack(prompts[c])) for c in ("clean_tokens", "corrupted_tokens"))
    ans, dis = (torch.tensor(prompts[c].to_numpy()) for c in ("answer_id", "distractor_id"))
    with torch.no_grad():
        x_clean = model.run_with_cache(clean, names_filter=hook)[1][hook]
        x_corr = model.run_with_cache(corr, names_filter=hook)[1][hook]
        delta = sae.encode(x_corr) - sae.encode(x_clean)
        base = splice.logit_diff(model(clean), ans, dis)
        expected = []
        for f in range(D_SAE):
            x = x_clean + delta[..., f, None] * sae.W_dec[f]
            with model.hooks(fwd_hooks=[(hook, lambda act, hook, x=x: x)]):
                expected.append((base - splice.logit_diff(model(clean), ans, dis)).mean())
    cfg = AttributionConfig(method=method, ig_steps=4, validation_features=0)
    frame = attr.score_nodes(model, prompts, saes, cfg).frame
    ours = frame[(frame["key"] == hook + ".sae:feats")].sort_values("index")[f"score_{method}"]
    expected = torch.stack(expected).numpy()
    assert np.abs(expected).max() > 1e-2  # features that move the metric
    np.testing.assert_allclose(ours.to_numpy(), expected, atol=1e-5, rtol=1e-4)


def test_bos_bypass_zeroes_features_at_bos_and_keeps_the_logits(tiny):
    model, saes, prompts = tiny
    tokens = torch.tensor(np.stack(prompts["clean_tokens"]))
    sp = splice.Spliced.of(model, saes, bypass_bos=True)
    with torch.no_grad():
        run = sp.run(tokens)
        plain = model(tokens)
    torch.testing.assert_close(run.logits, plain, atol=1e-5, rtol=1e-5)
    for hook in saes:
        feats = run.acts[hook + ".sae:feats"]
        assert (feats[:, 0] == 0).all() and (feats[:, 1:] > 0).any()


def test_edges_are_direct_effects_and_agree_with_exact_direct_paths(tiny):
    """Edges against an exact reference written here with TransformerLens hooks: feature f of
    the layer-0 SAE -> head (1, h) is f's change carried into layer 1's attention alone (the
    other layer-0 nodes held clean), then that head's new output set in the clean run. The
    last SAE's features -> logit is their whole effect (no node lies after them). Over the top
    edges the fast (integrated-gradient) weights rank as the exact ones do. (Attribution
    patching agrees less on this random model: linearised through LayerNorm, an error node's
    direct effect on the logits comes out 25 times too large.)"""
    model, saes, prompts = tiny
    # Every node of the tiny model in the graph, so every kind of pair is there.
    cfg = AttributionConfig(
        method="ig",
        ig_steps=8,
        validation_features=N_LAYERS * D_SAE,
        node_threshold=1.0,
        max_graph_nodes=200,
    )
    scores = attr.score_nodes(model, prompts, saes, cfg)
    frame = attr.with_score(scores.frame, cfg.method)
    nodes = circuit_graph.select_nodes(frame, cfg)
    sp = scores.spliced
    edges = circuit_graph.compute_edges(sp, prompts, nodes, cfg, scores.kept)
    feats0 = nodes[(nodes["kind"] == "feature") & (nodes["layer"] == 0)]
    feats1 = nodes[(nodes["kind"] == "feature") & (nodes["layer"] == 1)]
    pairs = [(u, f"head.1.{h}") for u in feats0["id"][:4] for h in range(N_HEADS)]
    pairs += [(u, "logit") for u in feats1["id"][:4]]
    exact = circuit_graph.exact_edges(sp, prompts, nodes, pairs, cfg)
    clean, corr = (torch.tensor(np.stack(prompts[c])) for c in ("clean_tokens", "corrupted_tokens"))
    ans, dis = (torch.tensor(prompts[c].to_numpy()) for c in ("answer_id", "distractor_id"))
    m_clean = splice.logit_diff(model(clean), ans, dis)
    for u, d in pairs:
        f = Node.parse(u)
        if d == "logit":
            row = frame[(frame["kind"] == "feature") & (frame["layer"] == f.layer)]
            whole = row[row["index"] == f.index]["score_exact"].iloc[0]
            assert exact[(u, d)] == pytest.approx(whole, abs=1e-4), (u, d)
            continue
        head = Node.parse(d)
        if f.layer != 0 or head.layer != 1:
            continue
        moved = _direct_feature_to_head(model, saes, clean, corr, f, head)
        expected = (m_clean - splice.logit_diff(moved, ans, dis)).mean().item()
        assert exact[(u, d)] == pytest.approx(expected, abs=1e-4), (u, d)
    validation = circuit_graph.validate_edges(sp, prompts, nodes, edges, cfg)
    assert validation["n_edges"] >= 16 and validation["spearman"] >= 0.8, validation

    # An SAE on every resid_post: its features and error are all that later layers and the
    # logit read of a layer, so a component (embedding: layer 0's) reaches nothing past its
    # layer through a direct path. Such pairs are candidates (edge_pairs) but carry no edge,
    # and no validated edge is one.
    def unreachable(u: str, d: str) -> bool:
        up = Node.parse(u)
        if up.kind not in ("embedding", "head", "mlp"):
            return False
        return d == "logit" or Node.parse(d).layer > max(up.layer, 0)

    candidates = circuit_graph.edge_pairs(nodes, cfg.edges)
    ids = [*nodes["id"], "logit"]
    assert any(unreachable(ids[i], ids[j if j is not None else -1]) for i, j in candidates)
    assert not [e for e in edges if unreachable(*e)]
    assert all(e["exact"] != 0 for e in validation["edges"]), validation["edges"]


def _direct_feature_to_head(model, saes, clean, corr, f: Node, head: Node) -> torch.Tensor:
    """Logits of the clean run with head (1, h) recomputed from layer 1's input in which only
    feature f of the layer-0 SAE moved to its corrupted value."""
    sae = saes[hook_name("resid_post", 0)]
    hook = hook_name("resid_post", 0)
    _, c = model.run_with_cache(clean, names_filter=hook)
    _, k = model.run_with_cache(corr, names_filter=hook)
    a_clean, a_corr = sae.encode(c[hook])[..., f.index], sae.encode(k[hook])[..., f.index]
    moved_in = c[hook] + (a_corr - a_clean)[..., None] * sae.W_dec[f.index]
    z_hook = f"blocks.{head.layer}.attn.hook_z"
    store = {}

    def record(act, hook):
        store["z"] = act.detach().clone()

    with model.hooks(fwd_hooks=[(hook_name("resid_pre", 1), lambda act, hook: moved_in),
                                (z_hook, record)]):  # fmt: skip
        model(clean)

    def set_head(act, hook):
        act = act.clone()
        act[:, :, head.index] = store["z"][:, :, head.index]
        return act

    with torch.no_grad(), model.hooks(fwd_hooks=[(z_hook, set_head)]):
        return model(clean)


def test_bridges_are_the_nodes_of_an_sae_the_kept_nodes_cross():
    """An SAE between kept nodes with none of its own kept gets its error node and its top
    features by |score| (none scoring 0); an SAE with a kept node, or after the last kept one,
    gets none; bridge_features 0 adds none."""
    import pandas as pd

    rows = [  # kind, order, score
        ("embedding", -1.0, 5.0),
        ("head", 0.1, 4.0),
        ("feature", 0.5, 0.3),  # the layer-0 SAE: many small features
        ("feature", 0.5, -0.5),
        ("feature", 0.5, 0.0),
        ("feature", 0.5, 0.2),
        ("error", 0.5, 0.1),
        ("head", 1.1, 4.0),
        ("feature", 1.5, 3.0),  # the layer-1 SAE: a feature is kept
        ("error", 1.5, 0.05),
        ("feature", 2.5, 0.4),  # an SAE after every kept node
        ("error", 2.5, 0.3),
    ]
    frame = pd.DataFrame(rows, columns=["kind", "order", "score"])
    keep = circuit_graph.cumulative_keep(frame["score"].to_numpy(), 0.8)
    assert sorted(keep.tolist()) == [0, 1, 7, 8]
    assert sorted(circuit_graph.bridge_rows(frame, keep, 2).tolist()) == [2, 3, 6]
    assert sorted(circuit_graph.bridge_rows(frame, keep, 9).tolist()) == [2, 3, 5, 6]
    assert circuit_graph.bridge_rows(frame, keep, 0).tolist() == []


def test_cumulative_keep():
    values = np.array([0.1, -5.0, 3.0, 1.0, 0.9])
    assert sorted(circuit_graph.cumulative_keep(values, 0.8).tolist()) == [1, 2]
    assert len(circuit_graph.cumulative_keep(values, 1.0)) == 5
    assert circuit_graph.cumulative_keep(values, 1.0, cap=2).tolist() == [1, 2]


@pytest.mark.parametrize("method", list(methods.REGISTRY))
def test_planned_passes_match_the_passes_the_stage_counts(tiny, method):
    """attribution_plan.passes (what the GPU-hours estimate charges) against the count the
    stage keeps where it runs the model: equal where the work is fixed by the config, an upper
    bound where it depends on the scores."""
    from dataclasses import replace

    from circuitflow.attribution import plan as attribution_plan
    from circuitflow.attribution import stage

    model, saes, prompts = tiny
    cfg = AttributionConfig(
        method=method,
        ig_steps=4,
        batch_size=3,
        validation_prompts=4,
        validation_heads=3,
        validation_features=5,
        validation_edges=6,
        max_graph_nodes=7,
    )
    scored = stage.score(model, prompts, saes, cfg, "tiny")
    meta = {"seconds": {}}
    graph = stage.build_graph(prompts, scored, cfg, meta)
    counted = scored.scores.spliced.counter.summary(len(prompts))["forward_equivalents_by_part"]
    n_nodes = sum(node["id"] != "logit" for node in graph["nodes"])
    planned = attribution_plan.passes(
        model.cfg,
        len(saes),
        replace(cfg, max_graph_nodes=n_nodes, bridge_features=0),
        len(prompts),
        D_SAE,
    )
    assert set(counted) == set(planned)
    # With the bridges left to the planner, it plans for as many as every SAE could add.
    bound = attribution_plan.passes(model.cfg, len(saes), cfg, len(prompts), D_SAE)["edges"]
    assert counted["edges"] <= bound
    for part in (method, "exact", "edges"):
        assert counted[part] == pytest.approx(planned[part]), part
    share = cfg.validation_prompts / len(prompts)
    assert share * (2 + cfg.validation_edges) < counted["edge_validation"]
    assert counted["edge_validation"] <= planned["edge_validation"]


def test_validation_passes_only_when_every_kind_with_enough_nodes_passes():
    """Pooled over kinds, many well-ranked features hide heads ranked backwards (induction on
    the embedded default: 0.91 over all nodes, -0.5 over its 3 live heads): `passed` then
    fails, naming the kind, while `passed_all_nodes` keeps the pooled verdict. A kind with
    fewer than 3 nodes (here 2 MLPs ranked backwards) is not judged on its own, and inert
    nodes (both scores exactly 0) count towards no kind's nodes."""
    import pandas as pd

    def frame(head_fast: list[float]) -> pd.DataFrame:
        feats = [(f, f) for f in np.linspace(1.0, 10.0, 12)]  # features ranked exactly
        rows = [("feature", fast, exact) for fast, exact in feats]
        exact = [0.66, 0.66, 0.99]
        rows += [("head", fast, x) for fast, x in zip(head_fast, exact, strict=True)]
        rows += [("head", 0.0, 0.0)] * 5  # pruned heads: inert
        rows += [("mlp", 20.0, 80.0), ("mlp", 80.0, 20.0)]
        return pd.DataFrame(rows, columns=["kind", "score_ig_validation", "score_exact"])

    backwards = attr.validation(frame([0.5, 0.4, 0.1]), "ig", 0.8)
    assert backwards["spearman"] >= 0.8 and backwards["passed_all_nodes"] is True
    assert backwards["by_kind"]["head"]["n_nodes"] == 3
    assert backwards["by_kind"]["head"]["n_inert"] == 5
    assert backwards["by_kind"]["head"]["passed"] is False
    assert backwards["passed"] is False and backwards["failed_kinds"] == ["head"]
    assert backwards["min_kind_nodes"] == 3
    assert backwards["by_kind"]["mlp"]["passed"] is None  # 2 nodes: too few to judge
    # Heads in exact's order (ties in exact leave them unranked against each other).
    forwards = attr.validation(frame([0.4, 0.5, 0.9]), "ig", 0.8)
    assert forwards["by_kind"]["head"]["passed"] is True
    assert forwards["passed"] is True and forwards["failed_kinds"] == []
    # The pooled agreement failing fails the whole, with every judged kind passing.
    assert attr.validation(frame([0.4, 0.5, 0.9]), "ig", 0.99)["passed"] is False


def test_graph_edges_show_the_exact_weight_where_it_was_computed(tiny):
    """graph.json's edges: the validated ones carry exact patching's weight (the fast estimate
    kept as weight_fast), edges into the logit are exact already, the rest the fast estimate;
    the graph's edges are pruned by the weight shown, as the page prunes them."""
    from circuitflow.attribution import stage

    model, saes, prompts = tiny
    cfg = AttributionConfig(method="atp", validation_features=6, validation_edges=8,
                            max_graph_nodes=10, edges="all")  # fmt: skip
    scored = stage.score(model, prompts, saes, cfg, "tiny")
    # Every feature's label from the features stage (by site and layer), here its own name.
    names = {site_layer(h): {i: f"{h}:{i}" for i in range(s.cfg.d_sae)} for h, s in saes.items()}
    meta = {"seconds": {}, "method": cfg.method}
    # One SAE names its Neuronpedia id (a published one's): its features link their pages.
    linked = sorted(names)[0]
    graph = stage.build_graph(prompts, scored, cfg, meta, labels=names,
                              neuronpedia={linked: "tiny-model/0-res"})  # fmt: skip
    for node in graph["nodes"]:
        feature = node["kind"] == "feature"
        own = names[(node["site"], node["layer"])][node["index"]] if feature else None
        assert node["label"] == own, node
        page = f"https://www.neuronpedia.org/tiny-model/0-res/{node['index']}"
        if feature and (node["site"], node["layer"]) == linked:
            assert node["neuronpedia"] == page
        else:
            assert "neuronpedia" not in node
    assert any(node["label"] for node in graph["nodes"])
    assert any("neuronpedia" in node for node in graph["nodes"])
    computed = {(e["source"], e["target"]): e for e in graph["computed_edges"]}
    validated = graph["edge_validation"]["edges"]
    assert len(validated) == 8
    for v in validated:
        e = computed[(v["source"], v["target"])]
        assert e["weight_source"] == "exact"
        assert e["weight"] == v["exact"] and e["weight_fast"] == v["weight"]
    # The case is there: exact patching moved some weight away from the fast estimate.
    assert any(abs(v["exact"] - v["weight"]) > 1e-3 for v in validated)
    checked = {(v["source"], v["target"]) for v in validated}
    into_logit = [e for pair, e in computed.items() if pair[1] == "logit"]
    assert into_logit and all(e["weight_source"] == "exact" for e in into_logit)
    for pair, e in computed.items():
        if pair not in checked:
            assert e["weight"] == e["weight_fast"]
            assert e["weight_source"] == ("exact" if pair[1] == "logit" else "atp")
    assert graph["n_edges_exact"] == len(checked) + len(into_logit)
    weights = np.array([e["weight"] for e in graph["computed_edges"]])
    kept = circuit_graph.cumulative_keep(weights, cfg.edge_threshold)
    assert graph["edges"] == [graph["computed_edges"][i] for i in sorted(kept)]


@pytest.mark.parametrize("method", list(methods.REGISTRY))
def test_kept_gradients_are_each_validation_prompts_own(tiny, method):
    """The edges reuse the score pass's gradients (scores.Kept) instead of a gradient pass of
    their own: kept for the validation prompts only, each prompt's (scored in batches of 3,
    mixed with other prompts) equal to its gradient computed alone, and its clean metric too."""
    model, saes, prompts = tiny
    cfg = AttributionConfig(method=method, ig_steps=3, batch_size=3, validation_prompts=4)
    scored = attr.score_nodes(model, prompts, saes, cfg)
    kept, sp = scored.kept, scored.spliced
    validation = attr.validation_prompts(prompts, cfg)
    assert sorted(kept.labels) == sorted(validation.index) and len(validation) == 4
    for label in validation.index:
        one = next(splice.iter_batches(prompts.loc[[label]], 1, "cpu"))
        corr = sp.acts(one.corrupted)
        with torch.no_grad():
            run = sp.run(one.clean)
        clean = {k: v.detach() for k, v in run.acts.items()}
        if method == "ig":
            want = ig.path_gradients(sp, one, list(clean), clean, corr, cfg.ig_steps)
        else:
            with torch.enable_grad():
                run = sp.run(one.clean)
                m = splice.logit_diff(run.logits, one.answer, one.distractor).sum()
                keys = list(run.acts)
                grads = torch.autograd.grad(m, [run.acts[k] for k in keys], allow_unused=True)
            want = {
                k: torch.zeros_like(clean[k]) if g is None else g
                for k, g in zip(keys, grads, strict=True)
            }
        have = kept.batch_gradients([label], list(clean), "cpu")
        for k in clean:
            torch.testing.assert_close(have[k], want[k], atol=1e-5, rtol=1e-4, msg=k)
        metric = splice.logit_diff(run.logits, one.answer, one.distractor)
        torch.testing.assert_close(kept.batch_metric([label], "cpu"), metric.detach())
