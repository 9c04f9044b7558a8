"""Cross-layer transcoders (sae.cross_layer, sae.cross_layer_files, sae.cross_layer_plan): folders
in circuit-tracer's layout and Gemma Scope 2's written here with random weights (by hand, not by
our writer), loaded as a published set is, and checked against a float64 reference written as
explicit loops over source and target layers; per-layer transcoders (SAELens's classes) as the
diagonal case; the round trip; lazy decoder rows; every refusal; the memory plan."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from circuitflow.errors import ConfigError, InputError
from circuitflow.sae.cross_layer import CrossLayerTranscoder, load_clt, save_clt
from circuitflow.sae.cross_layer_files import ModelShape, check_against, open_clt
from circuitflow.sae.cross_layer_plan import memory_plan, read_plan, refuse_unfit

L, D, F = 3, 16, 32
K = [3, 5, 4]  # TopK's and BatchTopK's k, one a layer
HOOKS = frozenset(
    f"blocks.{i}.{h}"
    for i in range(L)
    for h in ("hook_resid_mid", "ln2.hook_normalized", "hook_mlp_out", "hook_resid_pre")
)
MODEL = ModelShape(L, D, HOOKS, "LN", "tiny")


# --- random sets, written by hand in both layouts ---------------------------------------------
def random_weights(activation: str = "relu", skip: bool = False, seed: int = 0) -> dict:
    """Float32 numpy weights in circuit-tracer's shapes (W_dec[i]: [F, L - i, D])."""
    rng = np.random.default_rng(seed)

    def draw(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {
        "W_enc": draw(L, F, D),
        "b_enc": draw(L, F, scale=0.1),
        "b_dec": draw(L, D),
        "W_dec": [draw(F, L - i, D) for i in range(L)],
    }
    if activation == "jumprelu":
        w["threshold"] = rng.uniform(0.0, 0.4, (L, F)).astype(np.float32)
    if activation in ("topk", "batchtopk"):
        w["b_enc"][2] -= 1.2  # tokens with fewer than k positive: ReLU after the selection
    if skip:
        w["W_skip"] = draw(L, D, D, scale=0.1)
    return w


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def write_circuit_tracer(folder, w, activation="relu", config=None):
    """circuit-tracer's layout, as its to_safetensors writes it (keys by hand, not save_clt)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(L):
        enc = {f"W_enc_{i}": t(w["W_enc"][i]), f"b_enc_{i}": t(w["b_enc"][i]),
               f"b_dec_{i}": t(w["b_dec"][i])}  # fmt: skip
        if "threshold" in w:
            enc[f"threshold_{i}"] = t(w["threshold"][i])
        if "W_skip" in w:
            enc[f"W_skip_{i}"] = t(w["W_skip"][i])
        save_file(enc, folder / f"W_enc_{i}.safetensors")
        save_file({f"W_dec_{i}": t(w["W_dec"][i])}, folder / f"W_dec_{i}.safetensors")
    cfg = {
        "model_name": "tiny",
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": "hook_resid_mid",
        "feature_output_hook": "hook_mlp_out",
    }
    if activation in ("topk", "batchtopk"):
        cfg |= {"activation": activation, "k": K}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg | (config or {})))
    return folder


def write_gemma_scope_2(folder, w, with_config=True, seed=1):
    """Gemma Scope 2's layout: params_layer_{i}.safetensors with w_enc [D, F] and w_dec
    [F, L, D] whose targets before i hold junk (a reader must leave them out), and mwhanna's
    config.yaml listing the files under `transcoders`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(L):
        w_dec = rng.standard_normal((F, L, D)).astype(np.float32)
        w_dec[:, i:, :] = w["W_dec"][i]
        params = {"w_enc": t(w["W_enc"][i].T), "w_dec": t(w_dec), "b_enc": t(w["b_enc"][i]),
                  "b_dec": t(w["b_dec"][i]), "threshold": t(w["threshold"][i])}  # fmt: skip
        if "W_skip" in w:
            params["affine_skip_connection"] = t(w["W_skip"][i])
        save_file(params, folder / f"params_layer_{i}.safetensors")
    if with_config:
        cfg = {"model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
               "feature_output_hook": "hook_mlp_out", "model_name": "tiny",
               "transcoders": [f"params_layer_{i}.safetensors" for i in range(L)]}  # fmt: skip
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    return folder


# --- the reference: explicit loops, float64 --------------------------------------------------
def reference(w, x, activation, k=None, use=None):
    """Every target layer's reconstruction [L, n, D]: features per layer, then for each target
    t the sum over sources i <= t of f_i @ W_dec[i][:, t - i], + b_dec[t], + x_t W_skip[t]."""
    x = x.astype(np.float64)
    feats = []
    for layer in range(L):
        pre = x[layer] @ w["W_enc"][layer].astype(np.float64).T + w["b_enc"][layer]
        if activation == "relu":
            f = np.maximum(pre, 0)
        elif activation == "jumprelu":
            f = np.where(pre > w["threshold"][layer], pre, 0.0)
        elif activation == "topk":
            f = np.zeros_like(pre)
            for row in range(len(pre)):
                top = np.argsort(pre[row])[::-1][: k[layer]]
                f[row, top] = np.maximum(pre[row, top], 0)
        else:  # batchtopk: the k * n largest of the batch, ReLU'd
            r = np.maximum(pre, 0).ravel()
            keep = np.argsort(r)[::-1][: k[layer] * len(pre)]
            f = np.zeros_like(r)
            f[keep] = r[keep]
            f = f.reshape(pre.shape)
        if use is not None:  # positions left out after the activation (circuit-tracer's BOS)
            f[~use] = 0
        feats.append(f)
    out = np.zeros((L, x.shape[1], D))
    for target in range(L):
        out[target] = w["b_dec"][target]
        for source in range(target + 1):
            out[target] += feats[source] @ w["W_dec"][source][:, target - source, :]
        if "W_skip" in w:
            out[target] += x[target] @ w["W_skip"][target]
    return out


def inputs(n=7, seed=5):
    return np.random.default_rng(seed).standard_normal((L, n, D)).astype(np.float32)


CASES = [("circuit_tracer", "relu", False), ("circuit_tracer", "jumprelu", True),
         ("circuit_tracer", "topk", False), ("circuit_tracer", "batchtopk", True),
         ("gemma_scope_2", "jumprelu", False), ("gemma_scope_2", "jumprelu", True)]  # fmt: skip


def write(tmp_path, layout, activation, skip):
    w = random_weights(activation, skip)
    if layout == "gemma_scope_2":
        return w, write_gemma_scope_2(tmp_path / "gs2", w)
    return w, write_circuit_tracer(tmp_path / "ct", w, activation)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize(("layout", "activation", "skip"), CASES)
def test_reconstruction_matches_the_loops(tmp_path, layout, activation, skip, lazy):
    w, folder = write(tmp_path, layout, activation, skip)
    clt = load_clt(folder, MODEL, lazy=lazy)
    assert (clt.activation, clt.W_skip is not None, clt.d_transcoder) == (activation, skip, F)
    x = inputs()
    want = reference(w, x, activation, K)
    got = clt(torch.from_numpy(x))
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    feats = clt.encode_all(torch.from_numpy(x))
    assert (feats != 0).any() and (feats == 0).any()  # a sparse code, not a trivial one
    if activation == "topk":
        assert ((feats != 0).sum(-1) <= torch.tensor(K)[:, None]).all()


@pytest.mark.parametrize(("layout", "activation", "skip"), CASES)
def test_components_split_the_reconstruction_by_feature_and_target(
    tmp_path, layout, activation, skip
):
    w, folder = write(tmp_path, layout, activation, skip)
    clt = load_clt(folder, MODEL, lazy=True)
    x = inputs()
    use = np.ones(x.shape[1], bool)
    use[0] = False  # circuit-tracer's zero_positions, BOS
    c = clt.components(torch.from_numpy(x), torch.from_numpy(use))
    want = reference(w, x, activation, K, use)
    np.testing.assert_allclose(c.reconstruction.numpy(), want, rtol=1e-5, atol=1e-5)
    feats = c.features
    assert len(feats) and (feats[:, 1] > 0).all()  # nothing at BOS
    assert feats.tolist() == sorted(feats.tolist())  # (layer, position, feature)
    dense = clt.encode_all(torch.from_numpy(x))
    assert torch.equal(c.activations, dense[feats[:, 0], feats[:, 1], feats[:, 2]])
    pre = torch.stack([clt.pre_activations(i, torch.from_numpy(x[i])) for i in range(L)])
    assert torch.equal(c.preacts, pre[feats[:, 0], feats[:, 1], feats[:, 2]])
    assert torch.equal(c.encoders, clt.W_enc[feats[:, 0], feats[:, 2]])
    # One write per (feature, target >= its layer), each activation x that decoder block.
    assert len(c.writes) == int((L - feats[:, 0]).sum())
    src = feats[c.write_feature]
    assert (c.write_layer >= src[:, 0]).all()
    for j in (0, len(c.writes) // 2, len(c.writes) - 1):
        s, p, f = src[j].tolist()
        block = t(w["W_dec"][s][f, c.write_layer[j] - s])
        torch.testing.assert_close(c.writes[j], c.activations[c.write_feature[j]] * block)
    # The error nodes are what the real MLP outputs leave.
    mlp_out = torch.randn(L, x.shape[1], D)
    torch.testing.assert_close(c.errors(mlp_out) + c.reconstruction, mlp_out)


def diagonal_transcoder(w, layer, activation):
    """SAELens's transcoder (ours for TopK) holding the CLT's layer `layer` diagonal block."""
    from sae_lens import (
        JumpReLUSkipTranscoder,
        JumpReLUSkipTranscoderConfig,
        JumpReLUTranscoder,
        JumpReLUTranscoderConfig,
        Transcoder,
        TranscoderConfig,
    )

    from circuitflow.sae.transcoder import TopKTranscoder, TopKTranscoderConfig

    common = {"d_in": D, "d_sae": F, "d_out": D, "apply_b_dec_to_input": False}
    if activation == "topk":
        tc = TopKTranscoder(TopKTranscoderConfig(k=K[layer], **common))
    elif activation == "relu":
        tc = Transcoder(TranscoderConfig(**common))
    elif "W_skip" in w:
        tc = JumpReLUSkipTranscoder(JumpReLUSkipTranscoderConfig(**common))
    else:
        tc = JumpReLUTranscoder(JumpReLUTranscoderConfig(**common))
    with torch.no_grad():
        tc.W_enc.copy_(t(w["W_enc"][layer].T))
        tc.b_enc.copy_(t(w["b_enc"][layer]))
        tc.W_dec.copy_(t(w["W_dec"][layer][:, 0, :]))
        tc.b_dec.copy_(t(w["b_dec"][layer]))
        if activation == "jumprelu":
            tc.threshold.copy_(t(w["threshold"][layer]))
        if "W_skip" in w:
            tc.W_skip.copy_(t(w["W_skip"][layer].T))  # SAELens's skip is [d_out, d_in]
    return tc.eval()


DIAGONAL = [("relu", False), ("jumprelu", False), ("jumprelu", True), ("topk", False)]


@pytest.mark.parametrize(("activation", "skip"), DIAGONAL)
def test_a_diagonal_clt_is_per_layer_transcoders(tmp_path, activation, skip):
    from circuitflow.sae.transcoder import transcoder_output

    w = random_weights(activation, skip, seed=3)
    for i in range(L):
        w["W_dec"][i][:, 1:, :] = 0  # no source writes past its own layer
    clt = load_clt(write_circuit_tracer(tmp_path / "ct", w, activation), MODEL)
    x = torch.from_numpy(inputs())
    got = clt(x)
    for layer in range(L):
        tc = diagonal_transcoder(w, layer, activation)
        want = transcoder_output(tc, x[layer]).detach()
        torch.testing.assert_close(got[layer], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(clt.encode(layer, x[layer]), tc.encode(x[layer]).detach())


@pytest.mark.parametrize(("layout", "activation", "skip"), CASES)
def test_save_then_load_is_bitwise(tmp_path, layout, activation, skip):
    _, folder = write(tmp_path, layout, activation, skip)
    clt = load_clt(folder, MODEL)
    out = tmp_path / "saved"
    out.mkdir()
    (out / "stale.txt").write_text("replaced whole")
    save_clt(clt, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, "saved"])
    back = load_clt(out, MODEL)
    for (name, a), (_, b) in zip(clt.named_parameters(), back.named_parameters(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert (back.activation, back.k, back.feature_input_hook) == (
        clt.activation, clt.k, clt.feature_input_hook)  # fmt: skip
    # What circuit-tracer's load_clt reads: these keys and shapes, the threshold's presence
    # meaning JumpReLU; config.yaml's model_kind and hooks.
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["model_kind"] == "cross_layer_transcoder"
    assert (cfg["feature_input_hook"], cfg["feature_output_hook"]) == ("hook_resid_mid",
                                                                      "hook_mlp_out")  # fmt: skip
    for i in range(L):
        enc = load_file(out / f"W_enc_{i}.safetensors")
        assert enc[f"W_enc_{i}"].shape == (F, D) and enc[f"b_dec_{i}"].shape == (D,)
        assert (f"threshold_{i}" in enc) == (activation == "jumprelu")
        assert load_file(out / f"W_dec_{i}.safetensors")[f"W_dec_{i}"].shape == (F, L - i, D)


def test_bfloat16_round_trip_and_float32_sums(tmp_path):
    w = random_weights("jumprelu")
    clt = load_clt(write_circuit_tracer(tmp_path / "ct", w), MODEL, dtype=torch.bfloat16)
    save_clt(clt, tmp_path / "bf16")
    back = load_clt(tmp_path / "bf16", MODEL, dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(clt.parameters(), back.parameters(), strict=True))
    assert back.W_dec[0].dtype == torch.bfloat16
    x = torch.from_numpy(inputs())
    assert back(x).dtype == torch.float32
    # Stored in float32, held in bfloat16: lazy rows are cast as held ones are.
    lazy = load_clt(tmp_path / "ct", MODEL, dtype=torch.bfloat16, lazy=True)
    assert torch.equal(lazy(x), clt(x))


@pytest.mark.parametrize("layout", ["circuit_tracer", "gemma_scope_2"])
def test_lazy_rows_equal_eager_ones(tmp_path, layout):
    w, folder = write(tmp_path, layout, "jumprelu", True)
    files = open_clt(folder, MODEL)
    eager = load_clt(folder, MODEL)
    rows = torch.tensor([0, 3, 4, 17, F - 1])
    for source in range(L):
        got = files.rows(source, rows)
        assert got.shape == (len(rows), L - source, D)
        assert torch.equal(got, eager.W_dec[source][rows])
        assert torch.equal(got, t(w["W_dec"][source])[rows])
    lazy = load_clt(folder, MODEL, lazy=True)
    assert lazy.W_dec is None
    x = torch.from_numpy(inputs())
    assert torch.equal(lazy(x), eager(x))


# --- checks -----------------------------------------------------------------------------------
def edit_file(path, key, value=None):
    """Rewrite safetensors file `path` with `key` set to `value` (None: removed)."""
    tensors = load_file(path)
    if value is None:
        del tensors[key]
    else:
        tensors[key] = value
    save_file(tensors, path)


def nan_at(path, key):
    x = load_file(path)[key].clone()
    x.view(-1)[3] = float("nan")
    edit_file(path, key, x)


def inf_at(path, key):
    x = load_file(path)[key].clone()
    x.view(-1)[-1] = float("inf")
    edit_file(path, key, x)


def set_config(folder, **changes):
    cfg = yaml.safe_load((folder / "config.yaml").read_text()) | changes
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))


REFUSALS = {
    "no config.yaml": (lambda f: (f / "config.yaml").unlink(), MODEL, "config.yaml: missing"),
    "model_kind": (lambda f: set_config(f, model_kind="transcoder_set"), MODEL,
                   "config.yaml: model_kind 'transcoder_set' is not cross_layer_transcoder"),
    "encoder file missing": (lambda f: (f / "W_enc_1.safetensors").unlink(), MODEL,
                             "W_enc_1.safetensors: missing"),
    "decoder file missing": (lambda f: (f / "W_dec_2.safetensors").unlink(), MODEL,
                             "W_dec_2.safetensors: missing"),
    "more layers than the model": (lambda f: None, ModelShape(2, D, HOOKS),
                                   "W_enc_2.safetensors: layer 2, but the model has 2 layers"),
    "d_model": (lambda f: None, ModelShape(L, 24, HOOKS, name="tiny"),
                "W_enc_0.safetensors: W_enc_0 reads width 16, but tiny's d_model is 24"),
    "W_enc not 2-D": (lambda f: edit_file(f / "W_enc_0.safetensors", "W_enc_0",
                                          torch.zeros(1, F, D)), MODEL,
                      "W_enc_0.safetensors: W_enc_0 has shape [1, 32, 16], not [F, D]"),
    "F differs": (lambda f: edit_file(f / "W_enc_1.safetensors", "W_enc_1", torch.zeros(F - 1, D)),
                  MODEL, "W_enc_1.safetensors: W_enc_1 has shape [31, 16], not [32, 16]"),
    "b_enc missing": (lambda f: edit_file(f / "W_enc_2.safetensors", "b_enc_2"), MODEL,
                      "W_enc_2.safetensors: no tensor b_enc_2"),
    "decoder shape": (lambda f: edit_file(f / "W_dec_1.safetensors", "W_dec_1",
                                          torch.zeros(F, L, D)), MODEL,
                      "W_dec_1.safetensors: W_dec_1 has shape [32, 3, 16], not [32, 2, 16]"),
    "threshold in one layer": (lambda f: edit_file(f / "W_enc_1.safetensors", "threshold_1"),
                               MODEL, "W_enc_1.safetensors: lacks threshold_1, unlike layer 0"),
    "input hook not the model's": (lambda f: None, ModelShape(L, D, HOOKS - {
        "blocks.1.hook_resid_mid"}, name="tiny"),
        "config.yaml: feature_input_hook 'hook_resid_mid': blocks.1.hook_resid_mid is not a "
        "hook of tiny"),
    "output hook not the model's": (lambda f: set_config(f, feature_output_hook="hook_mlp_in"),
                                    MODEL, "config.yaml: feature_output_hook 'hook_mlp_in' is "
                                    "not an MLP output hook"),
    "input hook not an MLP input": (lambda f: set_config(f, feature_input_hook="hook_resid_pre"),
                                    MODEL, "feature_input_hook 'hook_resid_pre' is not an MLP "
                                    "input hook"),
    "normalisation": (lambda f: set_config(f, feature_input_hook="mlp.hook_in"),
                      ModelShape(L, D, HOOKS, "RMSPre"), "config.yaml: feature_input_hook "
                      "mlp.hook_in read the MLP's input after its norm's weight"),
    "topk with a threshold": (lambda f: set_config(f, activation="topk", k=2), MODEL,
                              "config.yaml: activation topk but the layer files have a threshold"),
    "topk without k": (lambda f: [set_config(f, activation="topk")] + [edit_file(
        f / f"W_enc_{i}.safetensors", f"threshold_{i}") for i in range(L)], MODEL,
        "config.yaml: k None: activation topk needs k"),
    "integer encoder": (lambda f: edit_file(f / "W_enc_2.safetensors", "b_dec_2",
                                            torch.zeros(D, dtype=torch.int32)), MODEL,
                        "W_enc_2.safetensors: b_dec_2 is int32, not floating point"),
    "truncated file": (lambda f: (f / "W_dec_0.safetensors").write_bytes(
        (f / "W_dec_0.safetensors").read_bytes()[:-8]), MODEL,
        "W_dec_0.safetensors: not a readable safetensors file"),
    "NaN in an encoder": (lambda f: nan_at(f / "W_enc_1.safetensors", "W_enc_1"), MODEL,
                          "W_enc_1.safetensors: W_enc_1 has 1 non-finite values (NaN or Inf)"),
    "Inf in a threshold": (lambda f: inf_at(f / "W_enc_0.safetensors", "threshold_0"), MODEL,
                           "W_enc_0.safetensors: threshold_0 has 1 non-finite values"),
    "Inf in a decoder": (lambda f: inf_at(f / "W_dec_2.safetensors", "W_dec_2"), MODEL,
                         "W_dec_2.safetensors: W_dec_2 has 1 non-finite values"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS)
def test_each_check_refuses_in_one_line(tmp_path, case):
    spoil, model, message = REFUSALS[case]
    folder = write_circuit_tracer(tmp_path / "ct", random_weights("jumprelu"))
    spoil(folder)
    with pytest.raises(InputError) as err:
        load_clt(folder, model)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(folder) in str(err.value)  # the file it names, by its path


def test_lazy_sets_find_non_finite_decoders_when_read_or_scanned(tmp_path):
    folder = write_circuit_tracer(tmp_path / "ct", random_weights())
    inf_at(folder / "W_dec_1.safetensors", "W_dec_1")  # the last row's last element
    lazy = load_clt(folder, MODEL, lazy=True)  # decoders are not read yet
    lazy.decoder_rows(1, torch.tensor([0, 1]))
    with pytest.raises(InputError, match=r"W_dec_1.safetensors: W_dec_1 has 1 non-finite"):
        lazy.decoder_rows(1, torch.tensor([F - 1]))
    with pytest.raises(InputError, match=r"W_dec_1.safetensors: W_dec_1 has 1 non-finite"):
        open_clt(folder, MODEL).check_finite(rows_a_read=5)


GS2_REFUSALS = {
    "a listed file missing": (lambda f: (f / "params_layer_1.safetensors").unlink(),
                              "params_layer_1.safetensors: missing"),
    "too few listed": (lambda f: set_config(f, transcoders=["params_layer_0.safetensors"]),
                       "config.yaml: transcoders lists 1 layers, the model has 3"),
    "w_dec not [F, L, D]": (lambda f: edit_file(f / "params_layer_2.safetensors", "w_dec",
                                                torch.zeros(F, 1, D)),
                            "params_layer_2.safetensors: w_dec has shape [32, 1, 16], not "
                            "[32, 3, 16]"),
    "no threshold": (lambda f: [edit_file(f / f"params_layer_{i}.safetensors", "threshold")
                                for i in range(L)],
                     "config.yaml: Gemma Scope 2's CLTs are JumpReLU, but the layer files lack "
                     "threshold"),
}  # fmt: skip


@pytest.mark.parametrize("case", GS2_REFUSALS)
def test_gemma_scope_2_checks(tmp_path, case):
    spoil, message = GS2_REFUSALS[case]
    folder = write_gemma_scope_2(tmp_path / "gs2", random_weights("jumprelu"))
    spoil(folder)
    with pytest.raises(InputError, match="^" + str(folder)) as err:
        open_clt(folder, MODEL)
    assert message in str(err.value)


def test_gemma_scope_2_folder_without_config_reads_its_own_hooks(tmp_path):
    folder = write_gemma_scope_2(tmp_path / "gs2", random_weights("jumprelu"), with_config=False)
    files = open_clt(folder, ModelShape(L, D, HOOKS, "RMS"))
    assert (files.feature_input_hook, files.feature_output_hook) == ("mlp.hook_in",
                                                                     "hook_mlp_out")  # fmt: skip
    assert files.layout == "gemma_scope_2" and files.config_file is None
    save_file({"x": torch.zeros(1)}, folder / "params_layer_3.safetensors")
    with pytest.raises(InputError, match="params_layer_3.safetensors: layer 3, but the model"):
        open_clt(folder, MODEL)


def test_hooks_against_a_transformer_lens_model_and_the_norm_fold(tmp_path):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=L, d_model=D, n_ctx=8, d_head=4, n_heads=4, d_mlp=32,
                                  d_vocab=11, act_fn="relu", normalization_type="LN")  # fmt: skip
    model = HookedTransformer(cfg)
    shape = ModelShape.of(model)
    folder = write_circuit_tracer(tmp_path / "ct", random_weights("relu", skip=True))
    for hook, folds in (("hook_resid_mid", False), ("ln2.hook_normalized", False),
                        ("mlp.hook_in", True)):  # fmt: skip
        set_config(folder, feature_input_hook=hook)
        assert check_against(open_clt(folder, shape), shape) is folds
    # Folded into the encoder, ln2's weight and bias leave features and output unchanged: the
    # CLT reads site mlp_in (n) where it read the MLP's input (w * n + b).
    clt = load_clt(folder, shape)
    n = torch.from_numpy(inputs())
    ln2 = [model.blocks[i].ln2 for i in range(L)]
    with torch.no_grad():
        for m in ln2:
            m.w.copy_(torch.rand(D) + 0.5)
            m.b.copy_(torch.randn(D) * 0.1)
    before = clt(torch.stack([n[i] * ln2[i].w + ln2[i].b for i in range(L)]))
    for i in range(L):
        clt.fold_input_norm(i, ln2[i].w, ln2[i].b)
    torch.testing.assert_close(clt(n), before, rtol=1e-5, atol=1e-5)


# --- the memory plan --------------------------------------------------------------------------
def test_memory_plan_counts_from_headers(tmp_path, monkeypatch):
    w = random_weights("jumprelu", skip=True)
    folder = write_circuit_tracer(tmp_path / "ct", {k: v for k, v in w.items()})
    # Headers only: no tensor may be read.
    import safetensors

    monkeypatch.setattr(safetensors, "safe_open", None)
    plan = read_plan(folder, MODEL)
    encoders = L * (F * D + F + D + F + D * D)  # W_enc, b_enc, b_dec, threshold, W_skip
    decoders = L * (L + 1) // 2 * F * D  # 6 blocks of [F, D]
    assert (plan.encoder_elements, plan.decoder_elements) == (encoders, decoders)
    assert plan.bytes("float32") == {"encoders": 4 * encoders, "decoders": 4 * decoders}
    assert plan.bytes("bfloat16") == {"encoders": 2 * encoders, "decoders": 2 * decoders}
    assert plan.stored_bytes == {"float32": 4 * (encoders + decoders)}
    monkeypatch.undo()
    # Gemma Scope 2 stores all L targets of every source; the plan holds the used ones.
    gs2 = memory_plan(open_clt(write_gemma_scope_2(tmp_path / "gs2", w), MODEL))
    assert gs2.decoder_elements == decoders
    assert gs2.stored_bytes == {"float32": 4 * (encoders + L * F * L * D)}


def test_a_plan_that_cannot_fit_is_refused_naming_the_key(tmp_path):
    plan = read_plan(write_circuit_tracer(tmp_path / "ct", random_weights()), MODEL)
    b = plan.bytes("float32")
    need = b["encoders"] + b["decoders"]
    refuse_unfit(plan, need, "float32", lazy=False, lazy_key="sae.clt.lazy")
    with pytest.raises(ConfigError) as err:
        refuse_unfit(plan, need - 1, "float32", lazy=False, lazy_key="sae.clt.lazy")
    text = str(err.value)
    assert text.startswith("sae.clt.lazy: the CLT ") and str(tmp_path / "ct") in text
    assert f"needs {need} bytes" in text and f"but {need - 1} (" in text
    assert "set sae.clt.lazy true" in text and "\n" not in text
    refuse_unfit(plan, b["encoders"], "float32", lazy=True, lazy_key="sae.clt.lazy")
    with pytest.raises(ConfigError, match=r"^model\.dtype: .* set model\.dtype a smaller"):
        refuse_unfit(plan, b["encoders"], "float32", lazy=True, lazy_key="sae.clt.lazy",
                     other=1)  # fmt: skip


def test_module_checks_its_arguments():
    with pytest.raises(ValueError, match="activation 'gelu'"):
        CrossLayerTranscoder(L, D, F, activation="gelu")
    with pytest.raises(ValueError, match="k 40: one a layer"):
        CrossLayerTranscoder(L, D, F, activation="topk", k=40)
    with pytest.raises(ValueError, match="no skip connection"):
        CrossLayerTranscoder(L, D, F).skip(0, torch.zeros(D))
    clt = CrossLayerTranscoder(L, D, F, skip=True)
    clt.W_skip.data.normal_()
    x = torch.randn(L, 4, D)
    skips = torch.stack([clt.skip(i, x[i]) for i in range(L)])
    zero = [torch.zeros(4, F)] * L  # one tensor a layer does too
    torch.testing.assert_close(clt.decode(zero, x), skips)  # b_dec is zero
    with pytest.raises(ValueError, match="decode needs inputs"):
        clt.decode(torch.zeros(L, 2, F))
    with pytest.raises(ValueError, match="inputs: 2 layers, the CLT has 3"):
        clt(torch.zeros(2, 4, D))


def test_gemma_scope_2_files_listed_as_hub_uris_come_from_the_cache(tmp_path):
    """mwhanna's config.yaml lists hf://google/gemma-scope-2-.../params_layer_{i}.safetensors:
    read from the Hugging Face cache (prefetched), never the network."""
    from circuitflow.sae.cross_layer_files import hub_file

    w = random_weights("jumprelu")
    snapshot = tmp_path / "hf/hub/models--google--gemma-scope-2-tiny/snapshots/abc123"
    write_gemma_scope_2(snapshot / "clt/w", w, with_config=False)
    (tmp_path / "hf/hub/models--google--gemma-scope-2-tiny/refs").mkdir(parents=True)
    (tmp_path / "hf/hub/models--google--gemma-scope-2-tiny/refs/main").write_text("abc123")
    folder = tmp_path / "mwhanna"
    folder.mkdir()
    uris = [f"hf://google/gemma-scope-2-tiny/clt/w/params_layer_{i}.safetensors" for i in range(L)]
    cfg = {"model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
           "feature_output_hook": "hook_mlp_out", "transcoders": uris}  # fmt: skip
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    cache = str(tmp_path / "hf")
    clt = load_clt(folder, MODEL, resolve=lambda uri: hub_file(uri, cache))
    x = inputs()
    np.testing.assert_allclose(clt(torch.from_numpy(x)).numpy(), reference(w, x, "jumprelu"),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    set_config(folder, transcoders=[*uris[:2], uris[2].replace("tiny", "absent")])
    with pytest.raises(InputError, match=r"^hf://google/gemma-scope-2-absent/.*: not in the Hug"):
        open_clt(folder, MODEL, resolve=lambda uri: hub_file(uri, cache))
