"""Per-prompt replacement graphs (attribution/prompt_graphs), on a small trained transformer
with random TopK transcoders: the graph is exact whatever the transcoders' quality, and each
property is checked against a reference computed here by other means."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.sae_data import contexts, tiny_model
from helpers.transcoders import random_skip_transcoders, random_transcoders, replaced_logits

from circuitflow.attribution.prompt_graphs import files, heads, prune, replacement, validate
from circuitflow.attribution.prompt_graphs.stage import linearity_error
from circuitflow.nodes import EMBED_HOOK, hook_name, mlp_hook

torch.set_num_threads(1)
ANSWER, DISTRACTOR = 7, 11


@pytest.fixture(scope="module")
def setup():
    model = tiny_model()
    for p in model.parameters():
        p.requires_grad_(False)
    tokens = contexts(1, seed=5)[0, :12].tolist()
    return model, random_transcoders(model), tokens


def build(setup, **kw):
    model, tcs, tokens = setup
    kw = {"skip_bos": True, "max_feature_nodes": 10_000, "batch_size": 16} | kw
    return replacement.build(model, tcs, tokens, ANSWER, DISTRACTOR, **kw)


@pytest.fixture(scope="module")
def graph(setup):
    return build(setup)


def test_every_node_input_is_its_incoming_edges_plus_biases(graph):
    """Each feature's encoder pre-activation and the logit difference, as the real model
    computes them, equal the sum of their incoming edges and their bias terms."""
    assert graph.n_features > 50
    assert graph.inputs[-1] == pytest.approx(graph.metric)
    assert linearity_error(graph) < 1e-4 * graph.inputs.abs().max()
    # Not trivially: the edges carry most of each input.
    assert graph.adjacency[-1].abs().sum() > 0.5 * abs(graph.metric - graph.biases[-1])


def frozen_value(model, tokens, cache, embed, mlp_out, target, tcs, extra=()) -> float:
    """A target's input in the real model with every attention pattern and norm scale the
    clean run's, the embedding `embed` [P, d] and MLP outputs `mlp_out` {layer: [P, d]}."""
    replaced = {name for name, _ in extra}
    frozen = [
        (name, lambda act, hook, v=value: v)
        for name, value in cache.items()
        if name.endswith(("hook_pattern", "hook_scale")) and name not in replaced
    ]
    put = [(EMBED_HOOK, lambda act, hook: embed[None])]
    put += [(mlp_hook(layer), lambda act, hook, v=v: v[None]) for layer, v in mlp_out.items()]
    store = {}
    layer, pos, feat = target
    read = [] if layer < 0 else [(hook_name("mlp_in", layer), lambda a, hook: store.update(x=a))]
    with torch.no_grad():
        hooks = frozen + put + read + list(extra)
        logits = model.run_with_hooks(torch.tensor([tokens]), fwd_hooks=hooks)
    if layer < 0:
        return float(logits[0, -1, ANSWER] - logits[0, -1, DISTRACTOR])
    return float(store["x"][0, pos] @ tcs[layer].W_enc[:, feat] + tcs[layer].b_enc[feat])


def test_edges_are_direct_effects_measured_by_removing_each_source(setup, graph):
    """An edge is the change of its target's input when its source's write alone is taken
    out of the frozen model (two forward passes, no gradient)."""
    model, tcs, tokens = setup
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([tokens]))
    embed = cache[EMBED_HOOK][0]
    mlp = {layer: cache[mlp_hook(layer)][0] for layer in range(model.cfg.n_layers)}
    feats = graph.features.tolist()
    targets = [(-1, len(tokens) - 1, 0)] + [tuple(f) for f in feats if f[0] == 1][:3]
    g = torch.Generator().manual_seed(0)
    layer0 = [i for i, f in enumerate(feats) if f[0] == 0]
    sources = [layer0[int(j)] for j in torch.randint(len(layer0), (4,), generator=g)]
    checked = 0
    for target in targets:
        row = graph.logit_index if target[0] < 0 else feats.index(list(target))
        base = frozen_value(model, tokens, cache, embed, mlp, target, tcs)
        for s in sources:  # a layer-0 feature: its activation x decoder row removed
            layer, pos, f = feats[s]
            cut = dict(mlp)
            cut[layer] = mlp[layer].clone()
            cut[layer][pos] -= graph.activations[s] * tcs[layer].W_dec[f]
            edge = base - frozen_value(model, tokens, cache, embed, cut, target, tcs)
            assert graph.adjacency[row, s] == pytest.approx(edge, abs=1e-4), (target, feats[s])
            checked += abs(edge) > 1e-3
        for pos in (1, len(tokens) // 2, len(tokens) - 1):  # a token's embedding removed
            cut_embed = embed.clone()
            cut_embed[pos] = 0
            edge = base - frozen_value(model, tokens, cache, cut_embed, mlp, target, tcs)
            col = graph.token_index(pos)
            assert graph.adjacency[row, col] == pytest.approx(edge, abs=1e-4), (target, pos)
        err = graph.error_index(0, 2)  # layer 0's error node at position 2
        run = replacement.clean_run(model, torch.tensor(tokens), ANSWER, DISTRACTOR)
        dic = replacement.decompose(run, tcs, torch.arange(len(tokens)) == 0)
        cut = dict(mlp)
        cut[0] = mlp[0].clone()
        cut[0][2] -= dic.errors[0, 2]
        edge = base - frozen_value(model, tokens, cache, embed, cut, target, tcs)
        assert graph.adjacency[row, err] == pytest.approx(edge, abs=1e-4)
    assert checked >= 4


def test_a_skip_transcoders_linear_path_is_live_in_the_graph(setup):
    """A skip transcoder's skip path (x W_skip^T of the MLP's input) is no node: the frozen
    model computes it live, so an edge is what its source's removal changes through it too
    (measured with each MLP output held at the clean value less its skip path, the skip path
    added from the MLP's input in the same pass), every input is still exact, and the model
    with the graph's error nodes spliced in is the real model."""
    model, _, tokens = setup
    tcs = random_skip_transcoders(model)
    graph = replacement.build(model, tcs, tokens, ANSWER, DISTRACTOR, skip_bos=True,
                              max_feature_nodes=10_000, batch_size=16)  # fmt: skip
    assert linearity_error(graph) < 1e-4 * graph.inputs.abs().max()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([tokens]))
    skips = {layer: cache[hook_name("mlp_in", layer)][0] @ tc.W_skip.T
             for layer, tc in tcs.items()}  # fmt: skip
    held = {layer: cache[mlp_hook(layer)][0] - skips[layer] for layer in tcs}
    stash = {}
    live = [(hook_name("mlp_in", layer), lambda a, hook, n=layer: stash.update({n: a}))
            for layer in tcs]  # fmt: skip
    live += [(mlp_hook(layer), lambda a, hook, n=layer: a + stash[n] @ tcs[n].W_skip.T)
             for layer in tcs]  # fmt: skip
    embed = cache[EMBED_HOOK][0]
    target = (-1, len(tokens) - 1, 0)
    base = frozen_value(model, tokens, cache, embed, held, target, tcs, live)
    assert base == pytest.approx(graph.metric, abs=1e-4)
    through_skip = 0.0
    for pos in (1, len(tokens) // 2, len(tokens) - 2):
        cut = embed.clone()
        cut[pos] = 0
        edge = base - frozen_value(model, tokens, cache, cut, held, target, tcs, live)
        assert graph.adjacency[graph.logit_index, graph.token_index(pos)] == pytest.approx(
            edge, abs=1e-4
        ), pos
        frozen = base - frozen_value(model, tokens, cache, cut, dict(cache_mlp(cache, tcs)),
                                     target, tcs)  # fmt: skip
        through_skip = max(through_skip, abs(edge - frozen))
    assert through_skip > 1e-2  # the skip path carries part of the edges: the check can fail
    pruned = prune.prune(graph.adjacency, graph.kinds(), 0.8, 0.98)
    checked = validate.validate(graph, pruned.node_mask, pruned.node_influence, 5, 0.8)
    assert checked["spliced_metric"] == pytest.approx(graph.metric, abs=1e-4)


def cache_mlp(cache, tcs) -> dict:
    """Each MLP's clean output, held whole (its skip path frozen with it)."""
    return {layer: cache[mlp_hook(layer)][0] for layer in tcs}


def test_replacement_model_with_its_error_nodes_is_the_real_model(setup):
    """Every MLP module swapped for its transcoder (SAELens's forward) plus the graph's error
    vectors gives the real model's logits."""
    model, tcs, tokens = setup
    run = replacement.clean_run(model, torch.tensor(tokens), ANSWER, DISTRACTOR)
    dic = replacement.decompose(run, tcs, torch.arange(len(tokens)) == 0)
    errors = {layer: dic.errors[layer] for layer in tcs}
    got = replaced_logits(model, tcs, errors, torch.tensor(tokens))
    with torch.no_grad():
        want = model(torch.tensor([tokens]))[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # Without the errors it is not (the transcoders are random): the check can fail.
    zero = {layer: torch.zeros_like(e) for layer, e in errors.items()}
    assert not torch.allclose(replaced_logits(model, tcs, zero, torch.tensor(tokens)), want,
                              atol=1e-2)  # fmt: skip


def test_a_capped_graph_folds_the_other_features_into_their_error_nodes(setup, graph):
    """max_feature_nodes below the active features: the most influential are kept, the rest's
    edges move to their error nodes, and every kept node's input is still exact."""
    capped = build(setup, max_feature_nodes=20, batch_size=8)
    assert capped.n_features == 20 and capped.dropped_features == graph.n_features - 20
    assert linearity_error(capped) < 1e-4 * capped.inputs.abs().max()
    # The logit's incoming edges sum to the same total: nothing was lost.
    assert capped.adjacency[-1].sum() == pytest.approx(graph.adjacency[-1].sum(), abs=1e-4)
    kept = {tuple(f) for f in capped.features.tolist()}
    inf = prune.influence(graph.adjacency, prune.logit_weights(graph.kinds()))[: graph.n_features]
    ranked = [tuple(graph.features[i].tolist()) for i in inf.argsort(descending=True)[:5]]
    assert len(kept & set(ranked)) >= 4, "the greedy visit keeps the most influential features"
    rows = sum(v for k, v in capped.passes.items() if k == "graph_rows")
    assert rows == 3 * (20 + 1)  # a forward and a backward a row: the features kept, the logit


# --- influence, pruning and scores against references computed by hand -----------------------
def chain():
    """tokens t0, t1 -> features f0 (from t0, weight 3), f1 (from t1, 1; from f0, 1) -> logit
    (from f0, 2; f1, 1; error e, 1). Node order: f0, f1, e, t0, t1, logit."""
    a = torch.zeros(6, 6)
    a[0, 3] = 3.0
    a[1, 4] = 1.0
    a[1, 0] = 1.0
    a[5, 0], a[5, 1], a[5, 2] = 2.0, 1.0, 1.0
    return a, ["feature", "feature", "error", "token", "token", "logit"]


def test_influence_is_the_series_over_paths():
    """w B (I - B)^-1 with B the row-normalised |A|, by matrix inverse; and by hand for the
    chain: f0 = 1/2 + 1/4 * 1/2, t0 = f0, t1 = 1/4 * 1/2, e = 1/4."""
    a, kinds = chain()
    w = prune.logit_weights(kinds)
    got = prune.influence(a, w)
    b = prune.normalize(a).double()
    ref = w.double() @ b @ torch.linalg.inv(torch.eye(6, dtype=torch.float64) - b)
    torch.testing.assert_close(got.double(), ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got, torch.tensor([0.625, 0.25, 0.25, 0.625, 0.125, 0.0]))
    # From the known rows alone (a capped graph's greedy visit): the same.
    known = torch.tensor([0, 1, 5])
    torch.testing.assert_close(prune.influence_rows(a[known], known, w), got)


def test_threshold_keeps_the_smallest_top_share():
    scores = torch.tensor([5.0, 1.0, 3.0, 1.0])
    assert prune.cumulative_threshold(scores, 0.5) == 5.0  # 5 / 10
    assert prune.cumulative_threshold(scores, 0.8) == 3.0  # 8 / 10
    assert prune.cumulative_threshold(scores, 0.85) == 1.0
    assert prune.cumulative_threshold(torch.zeros(3), 0.5) == float("inf")


def test_pruning_keeps_the_influential_nodes_and_drops_dangling_ones():
    """Node influences (f0 .625, t0 .625, f1 .25, e .25, t1 .125) at threshold 0.6 keep f0 (and
    the tokens and logit, always); f1 and e go; t1, a token, stays without edges."""
    a, kinds = chain()
    p = prune.prune(a, kinds, node_threshold=0.6, edge_threshold=1.0)
    assert p.node_mask.tolist() == [True, False, False, True, True, True]
    assert {tuple(e) for e in torch.nonzero(p.edge_mask).tolist()} == {(0, 3), (5, 0)}
    everything = prune.prune(a, kinds, node_threshold=1.0, edge_threshold=1.0)
    assert everything.node_mask.all() and int(everything.edge_mask.sum()) == 6
    # An edge threshold that drops both of f1's inputs (.125 each of 1.875) leaves f1 with no
    # way in: f1 goes, and its edge out with it.
    tight = prune.prune(a, kinds, node_threshold=1.0, edge_threshold=0.75)
    assert not tight.node_mask[1] and not tight.edge_mask[:, 1].any()
    # circuit-tracer's `influence` field: the cumulative share, smallest for the top node.
    assert p.cumulative.tolist() == pytest.approx([1 / 3, 1.5 / 1.875, 1.75 / 1.875, 2 / 3,
                                                    1.0, 1.0])  # fmt: skip


def test_scores_by_hand():
    """replacement: tokens' influence (t0 .625 + t1 .125) over it plus the error's (.25);
    completeness: rows' non-error share (the logit's 3/4, others 1) weighted by influence
    (+1 for the logit)."""
    a, kinds = chain()
    s = prune.scores(a, kinds)
    assert s["replacement_score"] == pytest.approx(0.75 / 1.0)
    weights = torch.tensor([0.625, 0.25, 0.25, 0.625, 0.125, 1.0])
    non_error = torch.tensor([1, 1, 1, 1, 1, 0.75])
    assert s["completeness_score"] == pytest.approx(float((weights * non_error).sum() / 2.875))
    a[5, 2] = 0.0  # no error in the graph: both scores 1
    assert prune.scores(a, kinds) == pytest.approx(
        {"replacement_score": 1.0, "completeness_score": 1.0}
    )


# --- circuit-tracer's graph-file format ------------------------------------------------------
# Field names and order of circuit-tracer's frontend models (frontend/graph_models.py: Node,
# Metadata, QParams), schema_version 1.
CT_NODE_FIELDS = ["node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob",
                  "is_target_logit", "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp",
                  "influence", "activation"]  # fmt: skip
CT_METADATA = ["slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold",
               "schema_version"]  # fmt: skip
CT_QPARAMS = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}


NEURONPEDIA = {0: "tiny/0-tc", 1: "tiny/1-tc"}  # each layer's transcoder's Neuronpedia id


def test_graph_file_has_circuit_tracers_fields(setup, graph):
    model, _, tokens = setup
    kinds = graph.kinds()
    pruned = prune.prune(graph.adjacency, kinds, 0.8, 0.98)
    content = files.graph_file(
        graph, pruned, slug="p-0", scan="tiny", transcoder_list=[], prompt=" ".join(map(str,
        tokens)), prompt_tokens=[str(t) for t in tokens], node_threshold=0.8, answer_text="a",
        distractor_text="b", answer_prob=0.5, extra={}, neuronpedia=NEURONPEDIA,
    )  # fmt: skip
    content = json.loads(json.dumps(content))
    assert list(content)[:4] == ["metadata", "qParams", "nodes", "links"]
    assert list(content["metadata"]) == CT_METADATA and content["qParams"] == CT_QPARAMS
    ids = [n["node_id"] for n in content["nodes"]]
    # Unique but for circuit-tracer's own ambiguity: an error node's id `0_{layer}_{pos}` is
    # also layer 0's feature `layer` at `pos`.
    features = {
        n["node_id"] for n in content["nodes"] if n["feature_type"] != "mlp reconstruction error"
    }
    errors = [
        n["node_id"] for n in content["nodes"] if n["feature_type"] == "mlp reconstruction error"
    ]
    assert len(features) + len(set(errors)) == len(ids)
    by_type = {}
    for node in content["nodes"]:
        extra = ["circuitflow"] if node["feature_type"] == "cross layer transcoder" else []
        assert list(node) == CT_NODE_FIELDS + extra
        by_type.setdefault(node["feature_type"], []).append(node)
    for error in by_type["mlp reconstruction error"]:  # circuit-tracer's Node.error_node
        layer, pos = int(error["layer"]), error["ctx_idx"]
        assert (error["node_id"], error["feature"], error["jsNodeId"]) == (
            f"0_{layer}_{pos}",
            -1,
            f"{layer}_{pos}-0",
        )
    for node in by_type["cross layer transcoder"]:  # its Neuronpedia page, by its transcoder
        layer, feat, _ = map(int, node["node_id"].split("_"))
        page = f"https://www.neuronpedia.org/tiny/{layer}-tc/{feat}"
        assert node["circuitflow"] == {"neuronpedia": page}
    assert set(by_type) == {"cross layer transcoder", "mlp reconstruction error", "embedding",
                            "logit"}  # fmt: skip
    assert len(by_type["embedding"]) == len(tokens)  # every token, linked or not
    (logit,) = by_type["logit"]
    assert logit["layer"] == str(model.cfg.n_layers + 1) and logit["is_target_logit"]
    assert logit["node_id"] == f"{model.cfg.n_layers + 1}_{ANSWER}_{len(tokens) - 1}"
    assert logit["clerp"].split('"')[1] == "a" and "(p=0.500)" in logit["clerp"]
    feature = by_type["cross layer transcoder"][0]
    layer, feat, pos = map(int, feature["node_id"].split("_"))
    assert (feature["layer"], feature["ctx_idx"]) == (str(layer), pos)
    assert feature["feature"] == files.cantor(layer, feat) and feature["activation"] > 0
    tok = by_type["embedding"][3]
    assert tok["node_id"] == f"E_{tokens[3]}_3" and tok["layer"] == "E"
    assert set(ids) >= {x for link in content["links"] for x in (link["source"], link["target"])}
    assert len(content["links"]) == int(pruned.edge_mask.sum())
    assert files.cantor(0, 7) == 35  # circuit-tracer's own toy graph file: layer 0, feature 7


def test_a_features_clerp_is_its_label(setup, graph):
    """The features stage's labels (by layer, then feature) become the feature nodes' clerp."""
    _, _, tokens = setup
    pruned = prune.prune(graph.adjacency, graph.kinds(), 0.8, 0.98)
    labels = {}
    for layer, _, feat in graph.features.tolist():
        labels.setdefault(layer, {})[feat] = f"fires on L{layer}F{feat}"
    content = files.graph_file(
        graph, pruned, slug="p-0", scan="tiny", transcoder_list=[], prompt="", node_threshold=0.8,
        prompt_tokens=[str(t) for t in tokens], answer_text="a", distractor_text="b",
        answer_prob=0.5, extra={}, labels=labels,
    )  # fmt: skip
    feats = [n for n in content["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert feats
    for node in feats:
        layer, feat, _ = map(int, node["node_id"].split("_"))
        assert node["clerp"] == f"fires on L{layer}F{feat}"
    errors = [n for n in content["nodes"] if n["feature_type"] == "mlp reconstruction error"]
    assert all(n["clerp"] == "" for n in errors)


# --- the heads carrying each cross-position edge ---------------------------------------------
def test_head_terms_add_up_to_each_edge_and_match_pattern_ablations(setup, graph):
    """Every cross-position edge is the sum of its heads' terms (all heads computed), and a
    head's term is what its attention from the target's position to the other positions
    adds, measured by ablation in the frozen model: the edge with every later layer's
    attention at that position kept to the position itself, minus the same with the head's
    attention from there to elsewhere zeroed too (patterns are constants there: the model
    stays linear, two forward passes)."""
    model, tcs, tokens = setup
    kinds = graph.kinds()
    pruned = prune.prune(graph.adjacency, kinds, 0.95, 0.99)
    split = heads.split_edges(graph, pruned.edge_mask, top_heads=8, batch_size=16)
    assert len(split) > 10
    # At most `max_targets` targets, the most influential (the logit first), 8 rows each.
    before = graph.passes.get("edge_heads", 0)
    few = heads.split_edges(graph, pruned.edge_mask, 8, 16, 2, pruned.node_influence)
    targets = {t for t, _ in few}
    others = {t for t, _ in split} - {graph.logit_index}
    best = max(others, key=lambda t: float(pruned.node_influence[t]))
    assert targets == {graph.logit_index, best}
    assert 3 * 8 < graph.passes["edge_heads"] - before <= 3 * 8 * 2  # the logit: all 8 heads
    for (t, s), terms in split.items():
        assert sum(x.weight for x in terms) == pytest.approx(
            float(graph.adjacency[t, s]), abs=1e-4
        ), (kinds[t], kinds[s])
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([tokens]))
    embed = cache[EMBED_HOOK][0]
    mlp = {layer: cache[mlp_hook(layer)][0] for layer in range(model.cfg.n_layers)}
    last = len(tokens) - 1
    token_edges = [(t, s) for t, s in split if kinds[s] == "token" and t == graph.logit_index]
    assert token_edges
    checked = 0
    for t, s in token_edges[:3]:
        cut_embed = embed.clone()
        cut_embed[graph.position(s)] = 0
        for term in split[(t, s)][:4]:
            later = [own_position_only(cache, layer, last)
                     for layer in range(term.layer + 1, model.cfg.n_layers)]  # fmt: skip
            without = [*later, head_elsewhere_zeroed(cache, term.layer, term.head, last)]
            edges = []
            for hooks in (later, without):
                base = frozen_value(model, tokens, cache, embed, mlp, (-1, last, 0), tcs, hooks)
                cut = frozen_value(model, tokens, cache, cut_embed, mlp, (-1, last, 0), tcs, hooks)
                edges.append(base - cut)
            assert term.weight == pytest.approx(edges[0] - edges[1], abs=1e-4), term
            checked += abs(term.weight) > 1e-3
    assert checked >= 3


def own_position_only(cache, layer: int, query: int):
    """A hook_pattern hook: at `query`, every head attends only to its own position, with
    the weight the clean pattern gives it."""
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"].clone()
    row = pattern[:, :, query].clone()
    pattern[:, :, query] = 0
    pattern[:, :, query, query] = row[:, :, query]
    return (f"blocks.{layer}.attn.hook_pattern", lambda act, hook: pattern)


def head_elsewhere_zeroed(cache, layer: int, head: int, query: int):
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"].clone()
    own = pattern[:, head, query, query].clone()
    pattern[:, head, query] = 0
    pattern[:, head, query, query] = own
    return (f"blocks.{layer}.attn.hook_pattern", lambda act, hook: pattern)


# --- validation on the real model -------------------------------------------------------------
def linearised_metric(model, tcs, tokens, graph, ablate=None) -> float:
    """The metric of the model with transcoders spliced in, every norm's denominator and
    attention pattern held at the clean run's, and each feature's activation its encoder
    pre-activation where it was active in the clean run (0 elsewhere): the linearisation the
    graph's predictions assume, by a forward pass with `ablate` = (layer, pos, feature) zeroed."""
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([tokens]))
    frozen = [(n, lambda a, hook, v=v: v) for n, v in cache.items()
              if n.endswith(("hook_pattern", "hook_scale"))]  # fmt: skip
    stash = {}

    def write(layer):
        tc = tcs[layer]

        def fn(act, hook):
            x_clean = cache[hook_name("mlp_in", layer)][0]
            on = tc.encode(x_clean) != 0
            feats = (stash[layer][0] @ tc.W_enc + tc.b_enc) * on
            feats[0] = 0  # BOS: the real MLP
            if ablate is not None and ablate[0] == layer:
                feats[ablate[1], ablate[2]] = 0
            recon = x_clean.new_zeros(act.shape[1:])
            recon[1:] = (tc.encode(x_clean) @ tc.W_dec + tc.b_dec)[1:]
            error = cache[mlp_hook(layer)][0] - recon
            out = feats @ tc.W_dec + error
            out[1:] += tc.b_dec
            return out[None]

        return fn

    hooks = list(frozen)
    for layer in tcs:
        keep = lambda a, hook, layer=layer: stash.update({layer: a})  # noqa: E731
        hooks.append((hook_name("mlp_in", layer), keep))
        hooks.append((mlp_hook(layer), write(layer)))
    with torch.no_grad():
        logits = model.run_with_hooks(torch.tensor([tokens]), fwd_hooks=hooks)
    return float(logits[0, -1, ANSWER] - logits[0, -1, DISTRACTOR])


def test_predicted_ablations_are_the_linearised_model(setup, graph):
    """The graph's prediction for zeroing a feature equals the forward pass of the spliced
    model linearised as the graph is (patterns and norms frozen, active set fixed); and the
    spliced model with nothing ablated is the real model."""
    model, tcs, tokens = setup
    kinds = graph.kinds()
    pruned = prune.prune(graph.adjacency, kinds, 0.8, 0.98)
    result = validate.validate(graph, pruned.node_mask, pruned.node_influence, 5, 0.8)
    assert result["spliced_metric"] == pytest.approx(graph.metric, abs=1e-4)
    base = linearised_metric(model, tcs, tokens, graph)
    assert base == pytest.approx(graph.metric, abs=1e-4)
    for ab in result["ablations"]:
        want = linearised_metric(model, tcs, tokens, graph, tuple(ab["feature"])) - base
        assert ab["predicted"] == pytest.approx(want, abs=1e-3, rel=1e-3), ab
    assert sum(abs(ab["predicted"]) > 1e-3 for ab in result["ablations"]) >= 3
    assert graph.passes["validation"] == 3 + 2 * 5
    everything = validate.validate(graph, torch.ones(graph.n_nodes, dtype=torch.bool),
                                   pruned.node_influence, 5, 0.8)  # fmt: skip
    assert everything["faithfulness"] == pytest.approx(1.0)
    assert everything["metric_no_features"] != pytest.approx(graph.metric, abs=1e-2)


def test_transcoders_at_some_layers_leave_the_other_mlps_whole_and_say_so(
    tiny_hf_model_dir, tmp_path
):
    """The stage on transcoders of layer 0 only (a run of `layers: [0]` on a 2-layer model):
    the graph holds layer 1's MLP as error nodes alone (no feature), and summary.json lists
    that layer in `mlps_without_transcoders`."""
    import pandas as pd

    from circuitflow.attribution.prompt_graphs import stage
    from circuitflow.io import write_json
    from circuitflow.model.load import load_model, prefetch

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    write_json(model_dir / "model.json", prefetch(str(tiny_hf_model_dir)))
    model = load_model(model_dir, "cpu", "float32")
    assert model.cfg.n_layers == 2
    random_transcoders(model, d_sae=48, k=4)[0].save_model(tmp_path / "tc0")
    tokens = [0, *range(20, 29)]
    prompts = pd.DataFrame({"prompt_id": [0], "clean_tokens": [tokens],
                            "corrupted_tokens": [tokens[::-1]], "answer_id": [ANSWER],
                            "distractor_id": [DISTRACTOR]})  # fmt: skip
    prompts.to_parquet(tmp_path / "prompts.parquet")
    config = {"device": "cpu", "model": {"name": str(tiny_hf_model_dir)},
              "capture": {"exclude_bos": True},
              "attribution": {"prompt_graphs": 1, "prompt_graph_validation_features": 2,
                              "prompt_graph_node_threshold": 1.0,  # every node kept
                              "prompt_graph_edge_threshold": 1.0}}  # fmt: skip
    out = tmp_path / "prompt_graphs"
    summary = stage.run(config, "b", tmp_path / "prompts.parquet", model_dir / "model.json",
                        [tmp_path / "tc0"], out)  # fmt: skip
    assert summary["mlps_without_transcoders"] == [1]
    assert json.loads((out / "summary.json").read_text())["mlps_without_transcoders"] == [1]
    graph = json.loads((out / "b-0.json").read_text())
    layer_one = {n["feature_type"] for n in graph["nodes"] if str(n["layer"]) == "1"}
    assert layer_one == {"mlp reconstruction error"}
    assert any(n["feature_type"] == "cross layer transcoder" and str(n["layer"]) == "0"
               for n in graph["nodes"])  # fmt: skip


def test_the_scan_names_the_transcoder_set_as_circuit_tracer_does(tmp_path):
    """metadata.scan: the configured name; else circuit-tracer's own set (a release of its
    conversion) by its Hugging Face repository, with an empty transcoder_list as
    circuit-tracer writes a named set; else the model and the transcoders' folders."""
    from circuitflow.attribution.prompt_graphs.stage import scan_of

    dirs = [tmp_path / f"layer_{layer}" for layer in (0, 1)]
    config = {"attribution": {"prompt_graph_scan": None}, "model": {"name": "m"}}
    for d in dirs:
        d.mkdir()
    assert scan_of(config, dirs) == ("m", [str(d) for d in dirs])
    repo = "mwhanna/qwen3-0.6b-transcoders-lowl0"
    for d in dirs:
        (d / "metrics.json").write_text(
            json.dumps({"repo_id": repo, "conversion": "mwhanna_transcoder"})
        )
    assert scan_of(config, dirs) == (repo, [])
    (dirs[1] / "metrics.json").write_text(json.dumps({"repo_id": "other/repo", "conversion": None}))
    assert scan_of(config, dirs)[0] == "m"  # not one circuit-tracer set
    for d in dirs:  # a release circuit-tracer names otherwise (Gemma Scope 2's): no guess
        (d / "metrics.json").write_text(json.dumps({"repo_id": repo, "conversion": "gemma_3"}))
    assert scan_of(config, dirs)[0] == "m"
    named = {**config, "attribution": {"prompt_graph_scan": "a-set"}}
    assert scan_of(named, dirs) == ("a-set", [])
