"""Published transcoders (sae.pretrained with sae.kind transcoder): local copies of releases in
each SAELens conversion's own layout (circuit-tracer's Qwen3 transcoders, mwhanna_transcoder;
Gemma Scope 2's affine ones, gemma_3: helpers.published_transcoders) loaded through SAELens's
conversions, checked against the model, adapted to site mlp_in (the norm's weight folded into
the encoder where the release read the MLP's input after it), and drawn into exact per-prompt
graphs with the skip path live; on a tiny Qwen3 (random weights, norms' weights away from one).
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.dag import REPO
from helpers.published_transcoders import (
    D_SAE,
    GEMMA_FOLDER,
    lay_out_gemma_scope_2,
    lay_out_mwhanna,
    transcoder_weights,
)

from circuitflow.errors import ConfigError
from circuitflow.nodes import mlp_input
from circuitflow.published import Dictionary
from circuitflow.sae.pretrained import adapt_transcoder, folds_norm, load
from circuitflow.sae.transcoder import transcoder_output

D_MODEL = 32


@pytest.fixture(scope="module")
def releases(tiny_qwen3_dir, tmp_path_factory):
    """The tiny Qwen3 as the pipeline loads it, and each layout's local copy."""
    from circuitflow.model.load import load_local_hf

    root = tmp_path_factory.mktemp("releases")
    mwhanna = {n: transcoder_weights(D_MODEL, D_SAE, n, skip=False) for n in (0, 1)}
    gemma = {n: transcoder_weights(D_MODEL, D_SAE, 10 + n, skip=True) for n in (0, 1)}
    copies = {
        "mwhanna_transcoder": lay_out_mwhanna(root / "mwhanna", tiny_qwen3_dir, mwhanna),
        "gemma_3": lay_out_gemma_scope_2(root / "gemma", tiny_qwen3_dir, gemma),
    }
    model = load_local_hf(tiny_qwen3_dir, "cpu", torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, copies


FOLDERS = {"mwhanna_transcoder": "layer_{layer}.safetensors", "gemma_3": GEMMA_FOLDER}


def dictionary(copies, layout: str, layer: int) -> Dictionary:
    return Dictionary("mlp_out", layer, sae_id=FOLDERS[layout].format(layer=layer),
                      path=str(copies[layout]), format=layout)  # fmt: skip


@pytest.mark.parametrize("layout", ["mwhanna_transcoder", "gemma_3"])
def test_each_layout_reads_the_mlps_own_input_once_adapted(releases, layout):
    """Loaded through SAELens's conversion, a release read the MLP module's input (after the
    RMSNorm's weight); adapted, the transcoder reads site mlp_in (before it) and gives the same
    features and output as the release on the MLP's own input, taken from the module itself."""
    model, copies = releases
    tokens = torch.randint(1, 600, (2, 12), generator=torch.Generator().manual_seed(0))
    inputs = {}
    hooks = [
        model.blocks[n].mlp.register_forward_pre_hook(
            lambda module, args, n=n: inputs.__setitem__(n, args[0])
        )
        for n in (0, 1)
    ]
    try:
        _, cache = model.run_with_cache(tokens)
    finally:
        for h in hooks:
            h.remove()
    for layer in (0, 1):
        loaded = load(dictionary(copies, layout, layer), None, "cpu")
        release = copy.deepcopy(loaded.sae)
        assert adapt_transcoder(loaded.sae, loaded.view, layer, model) is True
        assert loaded.sae.cfg.metadata.hook_name == f"blocks.{layer}.ln2.hook_normalized"
        x_mlp, x_site = inputs[layer], cache[f"blocks.{layer}.ln2.hook_normalized"]
        want = release.encode(x_mlp)
        assert (want > 0).any() and (want == 0).any()
        torch.testing.assert_close(loaded.sae.encode(x_site), want, atol=2e-6, rtol=1e-5)
        out = transcoder_output(loaded.sae, x_site)
        torch.testing.assert_close(out, transcoder_output(release, x_mlp), atol=2e-6, rtol=1e-5)
        # Not trivially: unadapted, the release reads the site otherwise.
        assert not torch.allclose(release.encode(x_site), want, atol=1e-2)
    assert (getattr(loaded.sae, "W_skip", None) is not None) == (layout == "gemma_3")


@pytest.mark.parametrize("layout", ["mwhanna_transcoder", "gemma_3"])
def test_a_copy_with_nan_weights_is_refused_naming_its_file(releases, layout, tmp_path):
    """A local copy of a release in its own layout: its weight file (a file, or a folder's
    safetensors) checked for finite values, one line naming the file and the tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    from circuitflow.errors import InputError
    from circuitflow.sae.pretrained import check_finite

    _, copies = releases
    root = tmp_path / "copy"
    shutil.copytree(copies[layout], root)
    d = dictionary({layout: root}, layout, 1)
    check_finite(d)  # intact
    within = root / d.sae_id
    path = within if within.is_file() else within / "params.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name].view(-1)[:4] = float("nan")
    save_file(tensors, path)
    with pytest.raises(InputError) as err:
        check_finite(d)
    assert str(err.value) == (
        f"sae.pretrained.path: {root} {d.sae_id}: {path}: tensor '{name}' has 4 NaN values"
    )


def test_the_norm_folding_a_release_was_made_with_is_checked_against_the_model():
    """Whether a release's input needs the norm's weight folded, by what its hook read and how
    its model was loaded, against how the run's model is loaded; refused where the model as
    loaded cannot give that input."""
    unfolded, folded = mlp_input("RMS"), mlp_input("RMSPre")
    circuit_tracer = {"hook_name": "blocks.2.mlp.hook_in",
                      "model_from_pretrained_kwargs": {"fold_ln": False}}  # fmt: skip
    gemma = {"hook_name": "blocks.2.hook_mlp_in",
             "hf_hook_name": "model.layers.2.pre_feedforward_layernorm.output"}  # fmt: skip
    normalised = {"hook_name": "blocks.2.ln2.hook_normalized"}
    folded_release = {"hook_name": "blocks.2.mlp.hook_in"}  # TransformerLens's default: folded
    assert folds_norm(circuit_tracer, 2, unfolded) and folds_norm(gemma, 2, unfolded)
    assert not folds_norm(normalised, 2, unfolded) and not folds_norm(folded_release, 2, folded)
    assert not folds_norm(normalised, 2, folded)
    for view in (circuit_tracer, gemma):
        with pytest.raises(ValueError, match="loaded with its norms folded into the MLPs"):
            folds_norm(view, 2, folded)
    residual = {"hook_name": "blocks.2.hook_mlp_in"}  # TransformerLens's: before the norm
    for view, layer in ((residual, 2), (circuit_tracer, 3)):
        with pytest.raises(ValueError, match=rf"is not layer {layer}'s MLP input"):
            folds_norm(view, layer, unfolded)


def test_gemma_scope_2_skip_transcoders_draw_exact_graphs_on_the_qwen3(releases):
    """Affine transcoders, adapted, in the per-prompt graph: every input its edges plus biases,
    the spliced model (skip path included) the real one."""
    from circuitflow.attribution.prompt_graphs import prune, replacement, validate
    from circuitflow.attribution.prompt_graphs.stage import linearity_error

    model, copies = releases
    tcs = {}
    for layer in (0, 1):
        loaded = load(dictionary(copies, "gemma_3", layer), None, "cpu")
        adapt_transcoder(loaded.sae, loaded.view, layer, model)
        tcs[layer] = loaded.sae
    tokens = [0, *torch.randint(1, 600, (11,), generator=torch.Generator().manual_seed(3))]
    graph = replacement.build(model, tcs, [int(t) for t in tokens], 7, 11, skip_bos=True,
                              max_feature_nodes=4096, batch_size=32)  # fmt: skip
    assert graph.n_features > 0
    assert linearity_error(graph) < 1e-4 * max(1.0, float(graph.inputs.abs().max()))
    pruned = prune.prune(graph.adjacency, graph.kinds(), 0.8, 0.98)
    checked = validate.validate(graph, pruned.node_mask, pruned.node_influence, 4, 0.8)
    assert checked["spliced_metric"] == pytest.approx(graph.metric, abs=1e-4)


def test_a_copy_that_does_not_fit_is_refused_when_the_config_resolves(
    releases, tiny_qwen3_dir, tmp_path
):
    """Read through the conversion's own config function before any job: a copy made for
    another width, and a folder that is not the layout, refused in one line naming the key."""
    from circuitflow import config as cf_config

    _, copies = releases
    wide = lay_out_mwhanna(tmp_path / "wide", tiny_qwen3_dir,
                           {0: transcoder_weights(48, D_SAE, 0, skip=False)})  # fmt: skip
    base = {"model": {"name": str(tiny_qwen3_dir)}, "layers": [0], "sites": ["mlp_out"],
            "behaviours": {"ioi": {"source": "ioi", "n_prompts": 4}},
            "capture": {"corpus": str(REPO / ".test" / "corpus.txt")}}  # fmt: skip

    def resolve(pretrained):
        sae = {"kind": "transcoder", "source": "pretrained", "pretrained": pretrained}
        return cf_config.resolve({**base, "sae": sae}, tmp_path)

    good = {"path": str(copies["mwhanna_transcoder"]), "format": "mwhanna_transcoder",
            "sae_id": "layer_{layer}.safetensors"}  # fmt: skip
    resolve(good)
    with pytest.raises(ConfigError) as err:
        resolve(good | {"path": str(wide)})
    assert str(err.value).startswith("sae.pretrained.path: ") and "\n" not in str(err.value)
    assert "d_in 48 is not the model's d_model 32" in str(err.value)
    with pytest.raises(ConfigError, match=r"^sae.pretrained.path: .* not a gemma_3 release's"):
        resolve(good | {"format": "gemma_3", "sae_id": "transcoder_all/layer_{layer}_nothing"})
