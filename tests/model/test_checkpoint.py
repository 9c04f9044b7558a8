"""A TransformerLens checkpoint directory as the model (model.json kind `tl_checkpoint`), in
process: loading, planning shapes, the checks before any job, the MLP's input without
normalisation, and the example config/your-own-model.yaml runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import tl_checkpoints as tl
from helpers.dag import REPO
from safetensors.torch import load_file, save_file

from circuitflow import config as cf
from circuitflow.errors import InputError
from circuitflow.io import write_json
from circuitflow.model import architectures, checkpoint
from circuitflow.model.load import load_model, load_tokenizer, prefetch
from circuitflow.nodes import hook_name
from circuitflow.sae.stream_plan import StreamGroup

SHAPES = list(tl.SHAPES)


def model_dir_of(ckpt, tmp_path):
    """The model stage's output for checkpoint `ckpt`: model.json (prefetch) in a folder."""
    out = tmp_path / "model"
    write_json(out / "model.json", prefetch(str(ckpt)))
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_a_checkpoint_loads_as_the_model_it_was_saved_from(shape, tl_checkpoints, tmp_path):
    """model.json from the directory alone, then the model with the built model's logits, its
    buffers rebuilt where the file left them out (no_ln), and its word-level tokenizer."""
    built = tl.build(shape)
    model_dir = model_dir_of(tl_checkpoints[shape], tmp_path)
    info = json.loads((model_dir / "model.json").read_text())
    assert info["kind"] == "tl_checkpoint"
    assert info["weights_sha256"] == checkpoint.fingerprint(tl_checkpoints[shape])
    assert info["architecture"]["attn_only"] == (shape == "attn_only")
    loaded = load_model(model_dir, "cpu", "float32")
    if shape == "no_ln":
        assert "blocks.0.attn.mask" not in load_file(tl_checkpoints[shape] / "weights.safetensors")
    tokens = torch.tensor([[0, 5, 9, 3, 12, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), built(tokens), rtol=0, atol=0)
    assert load_tokenizer(model_dir).encode("w3 w19", add_special_tokens=False) == [5, 21]


def test_a_changed_checkpoint_is_refused_until_the_model_stage_reruns(tl_checkpoints, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tl_checkpoints["ln"], ckpt)
    model_dir = model_dir_of(ckpt, tmp_path)
    config = json.loads((ckpt / "tl_config.json").read_text())
    (ckpt / "tl_config.json").write_text(json.dumps(config | {"act_fn": "gelu"}))
    with pytest.raises(InputError, match="SHA-256 .* differs.*rerun the model stage"):
        load_model(model_dir, "cpu", "float32")


@pytest.mark.parametrize("shape", SHAPES)
def test_planning_reads_the_loaded_models_shape(shape, tl_checkpoints):
    """The shape every plan reads, from tl_config.json without torch, against the model itself:
    its fields and its parameter count (an attention-only model plans no MLP)."""
    model = tl.build(shape)
    planned = architectures.model_cfg({"model": {"name": str(tl_checkpoints[shape])}})
    for field in ("n_layers", "d_model", "n_heads", "d_head", "d_vocab", "n_ctx",
                  "normalization_type", "attn_only"):  # fmt: skip
        assert getattr(planned, field) == getattr(model.cfg, field), field
    assert planned.d_mlp == (0 if shape == "attn_only" else model.cfg.d_mlp)
    assert architectures.n_params(planned) == sum(p.numel() for p in model.parameters())


def test_without_normalisation_mlp_in_is_what_the_mlp_receives():
    """The transcoders' site, mlp_in, is blocks.L.hook_resid_mid in a model without
    normalisation: the very tensor the MLP module is called with; streaming jobs pair it."""
    model = tl.build("no_ln")
    seen = {}
    handle = model.blocks[0].mlp.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    hook = hook_name("mlp_in", 0, model.cfg.normalization_type)
    try:
        _, cache = model.run_with_cache(torch.tensor([[0, 4, 8, 15, 16, 21]]), names_filter=hook)
    finally:
        handle.remove()
    assert hook == "blocks.0.hook_resid_mid"
    torch.testing.assert_close(cache[hook], seen["x"], rtol=0, atol=0)
    pairs = StreamGroup((("mlp_out", 0),)).transcoder_pairs(model.cfg.normalization_type)
    assert pairs == {"blocks.0.hook_mlp_out": ("blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out")}
    with_norms = tl.build("ln")  # the embedded default's hook, which its run checks
    ln2 = hook_name("mlp_in", 0, with_norms.cfg.normalization_type)
    assert ln2 == "blocks.0.ln2.hook_normalized"
    assert "blocks.0.ln2.hook_normalized" in with_norms.hook_dict
    assert "blocks.0.ln2.hook_normalized" not in model.hook_dict


def test_a_transcoder_is_checked_against_the_mlp_input_of_a_checkpoint_without_norms(
    tl_checkpoints,
):
    """None is a model's norms (normalization_type null), not "unknown": site mlp_in of the
    checkpoint without norms is hook_resid_mid whether model.json says so (the jobs), the
    caller passes it, or the config is read (when it resolves). A transcoder this pipeline
    writes there (hook_resid_mid -> hook_mlp_out) fits it, as does one that read the MLP's own
    input (nothing to fold without a norm); on the checkpoint with LayerNorm it is refused."""
    from circuitflow.nodes import mlp_input
    from circuitflow.sae.pretrained import RunModel, differences
    from circuitflow.sae.pretrained_stage import run_model_of

    ours = {"hook_name": "blocks.0.hook_resid_mid", "hook_name_out": "blocks.0.hook_mlp_out"}
    module_input = {"hook_name": "blocks.0.mlp.hook_in", "hook_name_out": "blocks.0.hook_mlp_out",
                    "model_from_pretrained_kwargs": {"fold_ln": False}}  # fmt: skip
    for shape, norms in (("no_ln", None), ("ln", "LN")):
        config = {"model": {"name": str(tl_checkpoints[shape])}}
        info = prefetch(str(tl_checkpoints[shape]))
        assert info["architecture"]["normalization_type"] == norms
        runs = [run_model_of(config, info), RunModel.from_config(config, tl.D_MODEL, norms),
                RunModel.from_config(config, tl.D_MODEL)]  # fmt: skip
        for run in runs:
            assert run.mlp_in == mlp_input(norms)
            problems = differences(ours, "mlp_out", 0, run, kind="transcoder")
            if shape == "no_ln":
                assert problems == []
                assert differences(module_input, "mlp_out", 0, run, kind="transcoder") == []
            else:
                assert problems == [
                    "input hook blocks.0.hook_resid_mid is not layer 0's MLP input (the pipeline "
                    "reads blocks.0.ln2.hook_normalized; blocks.0.mlp.hook_in and a Hugging Face "
                    "pre-MLP norm's output are taken too)"
                ]


# --- checked before any job -----------------------------------------------------------------------
def run_config(ckpt, tmp_path, **overrides) -> dict:
    """A config of the checkpoint `ckpt` with its prompts and corpus."""
    prompts = tl.prompts_csv(tmp_path / "previous.csv", 8)
    corpus = tl.corpus(tmp_path / "corpus.txt", 20)
    config = {
        "model": {"name": str(ckpt)},
        "behaviours": {"previous": {"source": "file", "path": str(prompts), "n_prompts": 8}},
        "capture": {"corpus": str(corpus)},
        "sites": ["resid_post"],
    }
    return config | overrides


def edit_config(ckpt, **fields):
    config = json.loads((ckpt / "tl_config.json").read_text())
    config.update(fields)
    config = {k: v for k, v in config.items() if v != "<drop>"}
    (ckpt / "tl_config.json").write_text(json.dumps(config))


def edit_weights(ckpt, drop=None, add=None):
    weights = load_file(ckpt / "weights.safetensors")
    weights.pop(drop, None)
    save_file(weights | (add or {}), ckpt / "weights.safetensors")


BROKEN = {
    # name: (shape, how to break it, what the line names)
    "no weights": ("ln", lambda c: (c / "weights.safetensors").unlink(),
                   r"weights\.safetensors: missing; a TransformerLens checkpoint directory holds"),
    "no tokenizer": ("ln", lambda c: shutil.rmtree(c / "tokenizer"), r"tokenizer: missing"),
    "unknown field": ("ln", lambda c: edit_config(c, heads=3),
                      r"tl_config\.json: heads: not a HookedTransformerConfig field"),
    "no d_head": ("ln", lambda c: edit_config(c, d_head="<drop>"), r"tl_config\.json: d_head: "),
    "bad act_fn": ("ln", lambda c: edit_config(c, act_fn="swish"),
                   r"tl_config\.json: act_fn: 'swish': TransformerLens rejects it"),
    "non-causal": ("ln", lambda c: edit_config(c, attention_dir="bidirectional"),
                   r"tl_config\.json: attention_dir: 'bidirectional'.*needs causal attention"),
    "d_head disagrees": ("ln", lambda c: edit_config(c, d_head=12),
                         r"tl_config\.json: d_head: 12 makes blocks\.0\.attn\.W_Q \[3, 48, 12\]; "
                         r".*weights\.safetensors holds \[3, 48, 24\]"),
    "vocabulary too small": ("ln", lambda c: edit_config(c, d_vocab=20, d_vocab_out=20),
                             r"tl_config\.json: d_vocab: 20, and .*tokenizer has ids up to 21"),
    "a tensor missing": ("ln", lambda c: edit_weights(c, drop="blocks.0.mlp.W_in"),
                         r"weights\.safetensors: no tensor blocks\.0\.mlp\.W_in"),
    "an MLP in an attention-only model": (
        "attn_only", lambda c: edit_weights(c, add={"blocks.0.mlp.W_in": torch.zeros(48, 32)}),
        r"weights\.safetensors: blocks\.0\.mlp\.W_in is not a tensor of the model"),
}  # fmt: skip


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_checkpoint_is_refused_in_one_line_naming_file_and_key(
    name, tl_checkpoints, tmp_path
):
    shape, breaks, line = BROKEN[name]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tl_checkpoints[shape], ckpt)
    config = run_config(ckpt, tmp_path)
    cf.resolve(config)  # the intact copy passes
    breaks(ckpt)
    with pytest.raises(cf.ConfigError) as err:
        cf.resolve(config)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"model.name: {ckpt}"), message
    assert re.search(line, message), message


def poison(path, name, n, value=float("nan")):
    """Set the first `n` values of tensor `name` of safetensors file `path` to `value`."""
    weights = load_file(path)
    weights[name].view(-1)[:n] = value
    save_file(weights, path)


def test_weights_with_nan_are_refused_by_the_model_stage_before_any_job(tl_checkpoints, tmp_path):
    """The checks before any job read shapes; the model stage, which reads every weight, refuses
    a NaN or an infinity in one line naming the file and the tensor, through its script (exit
    status 2), and writes no model.json: no later job starts."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tl_checkpoints["ln"], ckpt)
    weights = ckpt / "weights.safetensors"
    poison(weights, "blocks.0.attn.W_Q", 3)
    poison(
        weights, "unembed.W_U", 1, float("-inf")
    )  # later in the file: the first bad tensor is named
    resolved = cf.resolve(run_config(ckpt, tmp_path))
    out = tmp_path / "model" / "model.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prefetch_model.py"), "--config",
         json.dumps(cf.section(resolved, "model")), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(f"model.name: {weights}: tensor 'blocks.0.attn.W_Q' has 3 NaN values")
    ), done.stderr
    assert not out.exists()
    poison(weights, "blocks.0.attn.W_Q", 3, 0.0)  # no NaN left: the infinity is named
    with pytest.raises(cf.ConfigError) as err:
        prefetch(str(ckpt))
    assert str(err.value) == f"model.name: {weights}: tensor 'unembed.W_U' has 1 infinite value"


SITES_REFUSED = {
    "attention-only, MLP site": ("attn_only", {"sites": ["mlp_out"], "sae": {"kind": "sae"}},
                                 r"sites: mlp_out: .* is attention-only \(attn_only: true\), "
                                 r"with no MLP; allowed values: resid_pre, resid_post, attn_out"),
    "attention-only, transcoders": ("attn_only", {"sae": {"kind": "both"}},
                                    r"sae\.kind: both: a transcoder stands in for an MLP"),
    "no normalisation, mlp_in": ("no_ln", {"sites": ["mlp_in"]},
                                 r"sites: mlp_in: .*no normalisation.* use resid_mid"),
}  # fmt: skip


@pytest.mark.parametrize("name", SITES_REFUSED)
def test_sites_the_model_lacks_are_refused(name, tl_checkpoints, tmp_path):
    shape, overrides, line = SITES_REFUSED[name]
    config = run_config(tl_checkpoints[shape], tmp_path, **overrides)
    with pytest.raises(cf.ConfigError, match=line):
        cf.resolve(config)
    resolved = cf.resolve(run_config(tl_checkpoints[shape], tmp_path))  # its other sites pass
    assert resolved["sae"]["kind"] == "sae" and resolved["layers"] == list(
        range(tl.SHAPES[shape]["n_layers"])
    )


def test_the_example_config_runs_the_checkpoint_the_helper_makes(tmp_path):
    """config/your-own-model.yaml's toy checkpoint, prompts and corpus (.test/make_tl_toy.py)
    are what helpers.tl_checkpoints writes today, and the config resolves on them."""
    tl.write_example(tmp_path)
    shipped = REPO / ".test"
    fresh, kept = tmp_path / tl.EXAMPLE["model"], shipped / tl.EXAMPLE["model"]
    assert checkpoint.fingerprint(fresh) == checkpoint.fingerprint(kept)
    for name in ("prompts", "corpus"):
        assert (tmp_path / tl.EXAMPLE[name]).read_text() == (shipped / tl.EXAMPLE[name]).read_text()
    resolved = cf.load(REPO / "config" / "your-own-model.yaml")
    assert resolved["model"]["name"] == ".test/tl-toy" and resolved["sae"]["kind"] == "both"
