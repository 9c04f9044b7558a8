"""Per-prompt graphs on a cross-layer transcoder (prompt_graphs.replacement with a
sae.cross_layer.CrossLayerTranscoder): on a tiny 3-layer model with random weights, every edge
against a reference written independently (explicit loops over each active feature and each
layer it writes to, one scalar leaf per feature, gradients by autograd through the model with
its patterns and norm scales held); a CLT whose decoders are zero off the diagonal gives the
per-layer transcoders' graph bit for bit; TopK and BatchTopK CLTs; the spliced check."""

from __future__ import annotations

import pytest
import torch
from helpers.transcoders import random_skip_transcoders, random_transcoders
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuitflow.attribution.prompt_graphs import files, heads, prune, replacement, validate
from circuitflow.sae.cross_layer import CrossLayerTranscoder, load_clt, save_clt

torch.set_num_threads(1)
N_LAYERS, D, F, VOCAB = 3, 16, 24, 40
ANSWER, DISTRACTOR = 7, 11
TOKENS = [0, 5, 17, 3, 29, 11, 8]


@pytest.fixture(scope="module")
def model():
    cfg = HookedTransformerConfig(n_layers=N_LAYERS, d_model=D, n_ctx=16, d_head=4, n_heads=4,
                                  d_mlp=32, d_vocab=VOCAB, act_fn="gelu",
                                  normalization_type="LN", seed=3, device="cpu")  # fmt: skip
    m = HookedTransformer(cfg).eval()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("ln1.w", "ln2.w", "ln_final.w")):  # norms that are not identities
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return m


def random_clt(activation: str, seed: int = 0, skip: bool = False, **kw) -> CrossLayerTranscoder:
    """A CLT with random weights; encoder biases low so a few features fire a token."""
    kw = {"feature_input_hook": "ln2.hook_normalized"} | kw
    clt = CrossLayerTranscoder(N_LAYERS, D, F, activation=activation, skip=skip, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(clt.W_enc.shape, generator=g) / D**0.5)
        clt.b_enc.copy_(torch.randn(clt.b_enc.shape, generator=g) * 0.3 - 0.6)
        clt.b_dec.copy_(torch.randn(clt.b_dec.shape, generator=g) * 0.2)
        for w in clt.W_dec:
            w.copy_(torch.randn(w.shape, generator=g) * 0.3)
        if clt.threshold is not None:
            clt.threshold.copy_(torch.rand(clt.threshold.shape, generator=g) * 0.3)
        if clt.W_skip is not None:
            clt.W_skip.copy_(torch.randn(clt.W_skip.shape, generator=g) * 0.1)
    return clt


def build(model, transcoders, **kw):
    kw = {"skip_bos": True, "max_feature_nodes": 10_000, "batch_size": 8} | kw
    return replacement.build(model, transcoders, TOKENS, ANSWER, DISTRACTOR, **kw)


# --- the reference: explicit loops, autograd -----------------------------------------------
def read_hook(clt: CrossLayerTranscoder, layer: int) -> str:
    """Where layer `layer`'s encoder reads: the MLP's normalised input, or the residual."""
    hook = "hook_resid_mid" if clt.feature_input_hook == "hook_resid_mid" else "ln2.hook_normalized"
    return f"blocks.{layer}.{hook}"


def reference_features(clt: CrossLayerTranscoder, cache) -> list[tuple[int, int, int, float]]:
    """(layer, position, feature, activation) of every active feature, by explicit code: the
    activation of each layer's pre-activations, none at position 0."""
    out = []
    for s in range(N_LAYERS):
        x = cache[read_hook(clt, s)][0].double()
        pre = x @ clt.W_enc[s].double().T + clt.b_enc[s].double()  # [P, F]
        if clt.activation == "relu":
            act = pre.clamp(min=0)
        elif clt.activation == "jumprelu":
            act = torch.where(pre > clt.threshold[s].double(), pre, 0.0)
        elif clt.activation == "topk":
            act = torch.zeros_like(pre)
            for p in range(len(pre)):
                top = sorted(range(F), key=lambda f, p=p: -float(pre[p, f]))[: clt.k[s]]
                for f in top:
                    act[p, f] = max(float(pre[p, f]), 0.0)
        else:  # batchtopk: the k * P largest ReLU'd values over the prompt, BOS included
            flat = sorted(((float(pre[p, f]), p, f) for p in range(len(pre)) for f in range(F)),
                          reverse=True)[: clt.k[s] * len(pre)]  # fmt: skip
            act = torch.zeros_like(pre)
            for v, p, f in flat:
                act[p, f] = max(v, 0.0)
        for p in range(1, len(TOKENS)):
            for f in range(F):
                if act[p, f] != 0:
                    out.append((s, p, f, float(act[p, f])))
    return out


def reference_rows(model, clt: CrossLayerTranscoder, targets: list[tuple[int, int, int]]):
    """For each target (layer, pos, feature; layer -1 the logit difference): (edges from each
    active feature, from each error node [L, P], from each token [P]), as
    activation x d target / d activation with one scalar leaf per feature, each feature's
    writes added to every layer t >= its own one at a time; the errors and embeddings leaves."""
    toks = torch.tensor(TOKENS)[None]
    _, cache = model.run_with_cache(toks)
    feats = reference_features(clt, cache)
    P = len(TOKENS)  # noqa: N806
    errors = []
    for t in range(N_LAYERS):
        recon = torch.zeros(P, D, dtype=torch.float64)
        recon[1:] += clt.b_dec[t].double()
        for s, p, f, a in feats:
            if s <= t:
                recon[p] += a * clt.W_dec[s][f, t - s].double()
        errors.append(cache[f"blocks.{t}.hook_mlp_out"][0].double() - recon)
    rows = [reference_row(model, clt, cache, feats, errors, target) for target in targets]
    return feats, rows


def reference_row(model, clt, cache, feats, errors, target):
    """One target's edges (reference_rows), by one backward pass."""
    layer, pos, feat = target
    P = len(TOKENS)  # noqa: N806
    a = torch.tensor([v for *_, v in feats], dtype=torch.float64, requires_grad=True)
    err = torch.stack(errors).clone().requires_grad_(True)
    emb = cache["hook_embed"].double().clone().requires_grad_(True)
    read = {}

    def mlp_out(t):
        def fn(act, hook):
            out = err[t].clone()
            out[1:] = out[1:] + clt.b_dec[t].double()
            for i, (s, p, f, _) in enumerate(feats):
                if s <= t:
                    one = torch.zeros(P, D, dtype=torch.float64)
                    one[p] = clt.W_dec[s][f, t - s].double()
                    out = out + a[i] * one
            return out[None].to(act.dtype)

        return fn

    def keep(t):
        def fn(act, hook):
            read[t] = act
            return act

        return fn

    hooks = [(k, lambda act, hook: cache[hook.name]) for k in cache
             if k.endswith(("hook_pattern", "hook_scale"))]  # fmt: skip
    hooks.append(("hook_embed", lambda act, hook: emb.to(act.dtype)))
    for t in range(N_LAYERS):
        hooks += [(f"blocks.{t}.hook_mlp_out", mlp_out(t)),
                  (read_hook(clt, t), keep(t))]  # fmt: skip
    logits = model.run_with_hooks(torch.tensor(TOKENS)[None], fwd_hooks=hooks)
    if layer < 0:
        value = logits[0, -1, ANSWER] - logits[0, -1, DISTRACTOR]
    else:
        value = read[layer][0, pos].double() @ clt.W_enc[layer, feat].double()
    ga, ge, gt = torch.autograd.grad(value, [a, err, emb])
    return (ga * a).detach(), (ge * err).sum(-1).detach(), (gt * emb).sum(-1)[0].detach()


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk", "batchtopk", "lazy",
                                        "residual"])  # fmt: skip
def test_edges_match_explicit_loops_over_features_and_target_layers(model, activation, tmp_path):
    """`lazy`: a JumpReLU CLT saved and read back with its decoder rows read from disk;
    `residual`: a ReLU CLT reading hook_resid_mid (circuit-tracer's default input hook)."""
    kw = {"k": [3, 2, 4]} if activation in ("topk", "batchtopk") else {}
    if activation == "residual":
        kw["feature_input_hook"] = "hook_resid_mid"
    base = {"lazy": "jumprelu", "residual": "relu"}.get(activation, activation)
    clt = random_clt(base, seed=1, **kw)
    if activation == "lazy":
        save_clt(clt, tmp_path / "clt")
        graph = build(model, load_clt(tmp_path / "clt", lazy=True))
    else:
        graph = build(model, clt)
    n_f = graph.n_features
    # Rows: the logit, and the first and last feature of the last layer with features.
    picks = [n_f - 1, int(torch.nonzero(graph.features[:, 0] == graph.features[-1, 0])[0])]
    targets = [(-1, len(TOKENS) - 1, 0)] + [tuple(graph.features[i].tolist()) for i in picks]
    feats, rows = reference_rows(model, clt, targets)
    assert [tuple(f[:3]) for f in feats] == [tuple(r) for r in graph.features.tolist()]
    torch.testing.assert_close(graph.activations.double(),
                               torch.tensor([f[3] for f in feats], dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert n_f > 10 and bool((graph.features[:, 0] < N_LAYERS - 1).any())
    for node, (f_edges, e_edges, t_edges) in zip([graph.logit_index, *picks], rows, strict=True):
        got = graph.adjacency[node].double()
        scale = got.abs().max()
        want = torch.cat([f_edges, e_edges.flatten(), t_edges, torch.zeros(1, dtype=got.dtype)])
        assert float((got - want).abs().max() / scale) < 1e-5, (activation, node)
    # Every input is its incoming edges plus its biases, the error nodes included.
    rows_done = graph.adjacency.abs().sum(1) > 0
    lhs = graph.adjacency[rows_done].sum(1) + graph.biases[rows_done]
    torch.testing.assert_close(lhs, graph.inputs[rows_done], rtol=1e-4, atol=1e-4)


def diagonal_clt(transcoders, activation: str, k: int | None = None) -> CrossLayerTranscoder:
    """The CLT holding each per-layer transcoder (SAELens orientation) at its own layer, its
    decoders into every later layer zero; a skip transcoder's W_skip transposed."""
    first = transcoders[0]
    skip = getattr(first, "W_skip", None) is not None
    clt = CrossLayerTranscoder(N_LAYERS, D, first.cfg.d_sae, activation=activation, k=k,
                               skip=skip, feature_input_hook="ln2.hook_normalized")  # fmt: skip
    # W_enc [L, F, D] held as the transcoders hold theirs ([D, F] a layer, transposed views):
    # a feature's encoder row is then the same strided vector, and its dot products the same
    # bits (a contiguous row sums in another order: 1 ulp apart in `biases`).
    clt.W_enc = torch.nn.Parameter(
        torch.stack([transcoders[i].W_enc for i in range(N_LAYERS)]).transpose(1, 2), False
    )
    with torch.no_grad():
        for layer, tc in transcoders.items():
            clt.b_enc[layer] = tc.b_enc
            clt.b_dec[layer] = tc.b_dec
            clt.W_dec[layer][:, 0] = tc.W_dec
            if skip:
                clt.W_skip[layer] = tc.W_skip.T
    return clt


@pytest.mark.parametrize("kind", ["topk", "skip"])
def test_a_clt_without_off_diagonal_decoders_is_the_per_layer_graph(model, kind):
    if kind == "topk":
        tcs = random_transcoders(model, d_sae=F, k=4)
        clt = diagonal_clt(tcs, "topk", k=4)
    else:
        tcs = random_skip_transcoders(model, d_sae=F)
        clt = diagonal_clt(tcs, "relu")
    a, b = build(model, tcs), build(model, clt)
    assert a.n_features > 10
    for part in ("features", "activations", "adjacency", "inputs", "biases", "head_attribution"):
        assert torch.equal(getattr(a, part), getattr(b, part)), part
    assert prune.scores(a.adjacency, a.kinds()) == prune.scores(b.adjacency, b.kinds())


def test_off_diagonal_decoders_change_only_what_they_reach(model):
    """The diagonal check above must be able to fail: with one later-layer decoder block
    nonzero the graph differs, and only in the edges of layer-0 features."""
    tcs = random_transcoders(model, d_sae=F, k=4)
    clt = diagonal_clt(tcs, "topk", k=4)
    with torch.no_grad():
        clt.W_dec[0][:, 2] = torch.randn(F, D, generator=torch.Generator().manual_seed(9))
    a, b = build(model, tcs), build(model, clt)
    assert torch.equal(a.features, b.features)
    moved = (a.adjacency != b.adjacency).any(0)
    assert bool(moved.any())
    assert bool((a.features[moved[: a.n_features], 0] == 0).all())


@pytest.mark.parametrize("activation", ["jumprelu", "batchtopk"])
def test_the_spliced_clt_with_its_errors_is_the_real_model(model, activation):
    """validate's spliced model on a CLT (every earlier layer's decoders into each MLP output,
    b_dec, skip, error): unablated it is the real model; ablating a feature changes it."""
    kw = {"k": 3} if activation == "batchtopk" else {}
    clt = random_clt(activation, seed=2, skip=True, **kw)
    graph = build(model, clt)
    masks = {layer: torch.ones(2, len(TOKENS), F) for layer in range(N_LAYERS)}
    layer, pos, feat = graph.features[0].tolist()
    masks[layer][1, pos, feat] = 0.0
    metrics = validate.spliced_metrics(graph, masks)
    assert abs(float(metrics[0]) - graph.metric) < 1e-4
    assert abs(float(metrics[1]) - graph.metric) > 1e-4


def test_a_clt_graph_file_names_nodes_as_circuit_tracer_does(model):
    """Feature nodes at their source layer, `{layer}_{feature}_{pos}`, id cantor(layer,
    feature), type "cross layer transcoder"; the first position's treatment stated."""
    graph = build(model, random_clt("relu", seed=1))
    kinds = graph.kinds()
    pruned = prune.prune(graph.adjacency, kinds, 0.8, 0.98)
    content = files.graph_file(graph, pruned, slug="p", scan="tiny-clt", transcoder_list=[],
                               prompt_tokens=[str(t) for t in TOKENS], prompt="p",
                               node_threshold=0.8, answer_text="a", distractor_text="b",
                               answer_prob=0.5, extra={"prompt_id": 0})  # fmt: skip
    assert content["circuitflow"] == {"first_position": replacement.FIRST_POSITION[True],
                                      "prompt_id": 0}  # fmt: skip
    nodes = [n for n in content["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert nodes and {n["node_id"] for n in nodes} <= {
        f"{layer}_{feat}_{pos}" for layer, pos, feat in graph.features.tolist()
    }
    for n in nodes:
        layer, feat, pos = map(int, n["node_id"].split("_"))
        assert (n["layer"], n["ctx_idx"], n["feature"]) == (str(layer), pos,
                                                            files.cantor(layer, feat))  # fmt: skip


def test_a_clt_graphs_heads_and_validation(model):
    """What the stage computes after the graph works on a CLT graph: every cross-position
    edge is the sum of its heads' terms (all 12 heads; a CLT feature's writes into later layers
    included), and the validation (spliced model, ablations through the graph)."""
    graph = build(model, random_clt("jumprelu", seed=1))
    pruned = prune.prune(graph.adjacency, graph.kinds(), 0.95, 0.99)
    split = heads.split_edges(graph, pruned.edge_mask, top_heads=12, batch_size=16)
    assert len(split) > 10
    for (t, s), terms in split.items():
        assert sum(x.weight for x in terms) == pytest.approx(float(graph.adjacency[t, s]),
                                                             abs=1e-5)  # fmt: skip
    out = validate.validate(graph, pruned.node_mask, pruned.node_influence, 5, 0.0)
    assert abs(out["spliced_metric"] - graph.metric) < 1e-4 and len(out["ablations"]) == 5
    assert out["faithfulness"] is not None
