"""Published dictionaries (sae.source: pretrained) on the tiny Hugging Face model (.test/tiny-gpt2):
local directories of each architecture, a release read offline from a Hugging Face cache the
test lays out (a repo id, and gpt2-small-res-jb's own repo and config overrides), and each bad
input refused in one line. Dictionaries are built here (tests/helpers/dictionaries.py)."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.dag import REPO
from helpers.dictionaries import REVISION, basis, build, lay_out_cache, save
from sae_lens import SAE
from safetensors.torch import load_file, save_file

from circuitflow import config as cf_config
from circuitflow import description, resources
from circuitflow.capture import tokens as capture_tokens
from circuitflow.errors import ConfigError, InputError
from circuitflow.model.load import load_for_analysis
from circuitflow.model.load import prefetch_stage as prefetch_model
from circuitflow.sae import pretrained, pretrained_stage
from circuitflow.sae.lifecycle import METRICS_KEYS
from circuitflow.sae.metrics import evaluate_sae

torch.set_num_threads(1)
D = 32  # the tiny model's d_model
N_DEAD = 3
EVAL_CONTEXTS = 8
REPO_ID = "circuitflow-test/tiny-saes"
JB_REPO = "jbloom/GPT2-Small-SAEs-Reformatted"  # gpt2-small-res-jb in SAELens's directory


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory, tiny_hf_model_dir):
    """model.json of the tiny model, the run's token set and the model as stages load it."""
    root = tmp_path_factory.mktemp("pretrained")
    raw = base_config(str(tiny_hf_model_dir), root / "hf", {}, source="capture")
    config = cf_config.resolve(raw, REPO)
    (root / "model").mkdir()
    model_json = root / "model" / "model.json"
    prefetch_model(config, model_json)
    npy, meta = root / "tokens.npy", root / "tokens.json"
    capture_tokens.run(config, model_json, npy, meta)
    tokens, info = capture_tokens.read_token_set(npy, meta)
    return {
        "root": root,
        "model_json": model_json,
        "npy": npy,
        "json": meta,
        "model": load_for_analysis(model_json.parent, "cpu"),
        "contexts": capture_tokens.last_contexts(tokens, EVAL_CONTEXTS),
        "bos": int(info["bos_token_id"]),
        "hf": root / "hf",
        "model_name": str(tiny_hf_model_dir),
    }


def base_config(model_name: str, hf: Path, pre: dict, source: str = "pretrained", **top) -> dict:
    return {
        "model": {"name": model_name, "hf_cache": str(hf), "n_layers": 2},
        "behaviours": {"ioi": {"source": "ioi", "n_prompts": 8}},
        "sites": ["resid_pre"],
        "layers": "all",
        "device": "cpu",
        "capture": {
            "corpus": str(REPO / ".test" / "corpus.txt"),
            "n_tokens": 1024,
            "context_length": 32,
        },
        "sae": {"source": source, "eval_contexts": EVAL_CONTEXTS, "pretrained": pre},
        **top,
    }


def resolved(inputs, pre: dict, model_name: str | None = None, **top) -> dict:
    raw = base_config(model_name or inputs["model_name"], inputs["hf"], pre, **top)
    return cf_config.resolve(raw, REPO)


def activations(inputs, hook: str, model=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The hook's activations on the evaluation contexts, BOS positions left out (as
    capture.exclude_bos leaves them), and the positions' mask."""
    model = model or inputs["model"]
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs["contexts"], names_filter=hook)
    keep = inputs["contexts"] != inputs["bos"]
    return cache[hook][keep].float(), keep


def threshold_for(inputs, hook: str, quantile: float = 0.8) -> float:
    """A JumpReLU threshold that lets about a fifth of the live latents' values through."""
    x, _ = activations(inputs, hook)
    return torch.quantile((x @ basis(D)).abs().flatten(), quantile).item()


def run_stage(inputs, config, layer: int, out: Path, site: str = "resid_pre") -> dict:
    return pretrained_stage.run(
        config, site, layer, inputs["model_json"], inputs["npy"], inputs["json"], out
    )


def assert_same_weights(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], msg=name)


# --- local directories ----------------------------------------------------------------------------
@pytest.mark.parametrize("architecture", ["standard", "topk", "jumprelu"])
def test_local_dictionary_is_written_and_measured_on_the_run(run_inputs, architecture, tmp_path):
    """Each architecture's local directory: written to saes/ loadable by SAE.load_from_disk with
    its weights unchanged, and its metrics those of the model's own activations at its hook
    (measured here independently: l0, dead latents, and for the exact standard dictionary full
    variance explained and the clean loss)."""
    hook = "blocks.1.hook_resid_pre"
    extra = {"threshold": threshold_for(run_inputs, hook)} if architecture == "jumprelu" else {}
    for layer in (0, 1):
        sae = build(
            architecture, D, f"blocks.{layer}.hook_resid_pre", "tiny-gpt2", n_dead=N_DEAD, **extra
        )
        save(sae, tmp_path / "dicts" / "resid_pre" / f"layer_{layer}")
    source = SAE.load_from_disk(tmp_path / "dicts" / "resid_pre" / "layer_1")
    config = resolved(run_inputs, {"path": str(tmp_path / "dicts" / "{site}" / "layer_{layer}")})
    out = tmp_path / "saes" / "resid_pre" / "layer_1"
    metrics = run_stage(run_inputs, config, 1, out)

    written = SAE.load_from_disk(out)
    assert written.cfg.architecture() == architecture
    assert written.cfg.metadata.hook_name == hook
    assert_same_weights(written, source)
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk.keys() == metrics.keys() and on_disk["l0"] == metrics["l0"]
    assert metrics["source"] == "pretrained" and metrics["trained"] is False
    assert set(METRICS_KEYS) <= metrics.keys() and metrics["kind"] == "sae"  # every source's
    assert metrics["tokens_trained"] == 0
    assert metrics["path"] == str(tmp_path / "dicts" / "resid_pre" / "layer_1")
    assert (metrics["site"], metrics["layer"], metrics["hook_name"]) == ("resid_pre", 1, hook)
    assert (metrics["d_in"], metrics["d_sae"]) == (D, 2 * D + N_DEAD)
    assert metrics["architecture"] == architecture and metrics["centering_folded"] is False

    x, keep = activations(run_inputs, hook)
    with torch.no_grad():
        feats = source.encode(x)
    fired = (feats != 0).any(0)
    assert metrics["eval_tokens"] == int(keep.sum())
    assert metrics["l0"] == pytest.approx((feats != 0).sum(1).float().mean().item())
    assert metrics["dead_fraction"] == pytest.approx(1 - fired.float().mean().item())
    assert metrics["dead_fraction"] * (2 * D + N_DEAD) >= N_DEAD - 1e-4  # the dead ones at least
    assert metrics["forward_equivalents_unit"] == "evaluation context"
    if architecture == "standard":  # [Q, -Q]: every activation reconstructed exactly
        assert metrics["explained_variance"] == pytest.approx(1.0, abs=1e-5)
        assert metrics["ce_sae"] == pytest.approx(metrics["ce_clean"], abs=1e-5)
        assert metrics["dead_fraction"] == pytest.approx(N_DEAD / (2 * D + N_DEAD))
    if architecture == "topk":
        assert 0 < metrics["l0"] <= 4
    if architecture == "jumprelu":
        assert 0 < metrics["l0"] < D / 2


# --- releases from the Hugging Face cache ---------------------------------------------------------
def test_release_is_fetched_then_loaded_offline_from_the_cache(run_inputs, tmp_path, monkeypatch):
    """A release named by its hub repo (as SAE.from_pretrained takes it), in a cache laid out
    on disk: prefetch_saes finds and checks every dictionary without the network, and the job
    loads its own offline and writes the same weights, recording the repo, folder and commit."""
    from huggingface_hub import constants

    hf = tmp_path / "hf"
    saes = {
        f"resid_pre/layer_{layer}": build(
            "topk", D, f"blocks.{layer}.hook_resid_pre", "tiny-gpt2", seed=layer, n_dead=N_DEAD
        )
        for layer in (0, 1)
    }
    lay_out_cache(hf / "hub", REPO_ID, saes)
    pre = {"release": REPO_ID, "sae_id": "{site}/layer_{layer}"}
    config = resolved({**run_inputs, "hf": hf}, pre)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the login node's cache, filled
    summary = pretrained_stage.prefetch_stage(
        config, run_inputs["model_json"], tmp_path / "prefetch.json"
    )
    monkeypatch.undo()
    assert json.loads((tmp_path / "prefetch.json").read_text()) == summary
    assert summary["hub_cache"] == str(hf / "hub")
    rows = {(r["site"], r["layer"]): r for r in summary["dictionaries"]}
    assert sorted(rows) == [("resid_pre", 0), ("resid_pre", 1)]
    assert rows[("resid_pre", 1)]["folder"] == "resid_pre/layer_1"
    assert rows[("resid_pre", 1)]["revision"] == REVISION
    assert rows[("resid_pre", 1)]["d_sae"] == 2 * D + N_DEAD

    out = tmp_path / "saes" / "resid_pre" / "layer_1"
    metrics = run_stage(run_inputs, config, 1, out)
    assert_same_weights(SAE.load_from_disk(out), saes["resid_pre/layer_1"])
    assert (metrics["release"], metrics["sae_id"]) == (REPO_ID, "resid_pre/layer_1")
    assert (metrics["repo_id"], metrics["folder"], metrics["revision"]) == (
        REPO_ID,
        "resid_pre/layer_1",
        REVISION,
    )
    assert 0 < metrics["l0"] <= 4 and metrics["tokens_trained"] == 0
    assert os.environ.get("HF_HOME") != str(hf)  # the job's cache setting did not leak


def test_gpt2_small_res_jb_maps_to_resid_pre_and_its_centring_is_folded(run_inputs, tmp_path):
    """SAELens's gpt2-small-res-jb, resolved through its directory (repo
    jbloom/GPT2-Small-SAEs-Reformatted, folder = id, config override center_writing_weights),
    on a run of model `gpt2` whose weights are the tiny GPT-2 (a stand-in: no download). Its
    hook blocks.L.hook_resid_pre fills site resid_pre, layer L; the published dictionary read
    activations of the model with writing weights centred, which the pipeline does not apply,
    so the written one reads the raw activations and gives the published features and losses."""
    hf = tmp_path / "hf"
    source = {
        f"blocks.{layer}.hook_resid_pre": build(
            "standard", D, f"blocks.{layer}.hook_resid_pre", "gpt2-small", seed=layer
        )
        for layer in (0, 1)
    }
    # Published cfg.json files carry no bias: give the encoder and decoder biases to fold.
    for sae in source.values():
        with torch.no_grad():
            sae.b_dec.copy_(torch.linspace(-0.05, 0.1, D))
            sae.b_enc.copy_(torch.linspace(-0.02, 0.02, 2 * D))
    lay_out_cache(hf / "hub", JB_REPO, source, legacy="gpt2-small")  # as jbloom published it
    pre = {"release": "gpt2-small-res-jb", "sae_id": "blocks.{layer}.hook_resid_pre"}
    config = resolved({**run_inputs, "hf": hf}, pre, model_name="gpt2")
    out = tmp_path / "saes" / "resid_pre" / "layer_1"
    metrics = run_stage(run_inputs, config, 1, out)
    assert (metrics["repo_id"], metrics["folder"]) == (JB_REPO, "blocks.1.hook_resid_pre")
    assert metrics["model_from_pretrained_kwargs"] == {"center_writing_weights": True}
    assert metrics["centering_folded"] is True

    hook = "blocks.1.hook_resid_pre"
    centred = load_for_analysis(run_inputs["model_json"].parent, "cpu")
    centred.process_weights_(fold_ln=False, center_writing_weights=True, center_unembed=False)
    x_raw, _ = activations(run_inputs, hook)
    x_centred, _ = activations(run_inputs, hook, centred)
    assert x_centred.mean(-1).abs().max() < 1e-5 < x_raw.mean(-1).abs().max()
    published, written = source[hook], SAE.load_from_disk(out)
    assert not written.cfg.metadata.model_from_pretrained_kwargs  # folded: nothing left to apply
    with torch.no_grad():
        torch.testing.assert_close(
            written.encode(x_raw), published.encode(x_centred), atol=1e-5, rtol=1e-4
        )
    reference = evaluate_sae(
        centred, published, run_inputs["contexts"], exclude_bos=True, bos_token_id=run_inputs["bos"]
    )
    for key in ("ce_clean", "ce_sae", "ce_zero", "l0"):
        assert metrics[key] == pytest.approx(reference[key], rel=1e-4), key


def test_a_hook_outside_the_configured_sites_is_refused_naming_its_site(run_inputs, tmp_path):
    hf = tmp_path / "hf"
    lay_out_cache(
        hf / "hub",
        JB_REPO,
        {
            f"blocks.{layer}.hook_resid_pre": build(
                "standard", D, f"blocks.{layer}.hook_resid_pre", "gpt2-small"
            )
            for layer in (0, 1)
        },
    )
    pre = {"release": "gpt2-small-res-jb", "sae_id": "blocks.{layer}.hook_resid_pre"}
    with pytest.raises(ConfigError) as err:
        resolved({**run_inputs, "hf": hf}, pre, model_name="gpt2", sites=["resid_post"])
    assert str(err.value) == (
        "sae.pretrained.sae_id: gpt2-small-res-jb blocks.0.hook_resid_pre: hook "
        "blocks.0.hook_resid_pre (site resid_pre, layer 0: list resid_pre in sites and 0 in "
        "layers to use it) is not blocks.0.hook_resid_post (site resid_post, layer 0)"
    )


# --- bad input, one line each ---------------------------------------------------------------------
def _local(tmp_path, layer_dirs: dict | None = None, **build_kwargs) -> dict:
    """Local dictionaries for layers 0 and 1 (each built by `build`, unless `layer_dirs` says
    what to write instead) and the sae.pretrained that names them."""
    for layer in (0, 1):
        d = tmp_path / "dicts" / "resid_pre" / f"layer_{layer}"
        kwargs = {
            "architecture": "topk",
            "d_in": D,
            "hook": f"blocks.{layer}.hook_resid_pre",
            "model_name": "tiny-gpt2",
        } | build_kwargs
        save(build(**kwargs), d)
        for name, action in (layer_dirs or {}).get(layer, {}).items():
            action(d / name)
    return {"path": str(tmp_path / "dicts" / "{site}" / "layer_{layer}")}


LAYER0 = str(Path("dicts") / "resid_pre" / "layer_0")
CONFIG_REFUSALS = {
    "d_in": (
        {"d_in": 16},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}: d_in 16 is not the model's d_model 32",
    ),
    "hook": (
        {"hook": "blocks.0.hook_mlp_out"},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}: hook blocks.0.hook_mlp_out (site mlp_out, layer "
        "0: list mlp_out in sites and 0 in layers to use it) is not blocks.0.hook_resid_pre "
        "(site resid_pre, layer 0)",
    ),
    "model": (
        {"model_name": "gpt2"},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}: made for model 'gpt2', not the run's model "
        "'{model}': set model.same_as: gpt2 if {model} is that model",
    ),
    "two differences": (
        {"model_name": "gpt2", "d_in": 16},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}: d_in 16 is not the model's d_model 32; made "
        "for model 'gpt2', not the run's model '{model}': set model.same_as: gpt2 if {model} is "
        "that model",
    ),
    "no weights": (
        {0: {"sae_weights.safetensors": Path.unlink}},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}: not a dictionary in SAELens's format (no "
        "sae_weights.safetensors; SAE.save_model or save_inference_model writes cfg.json and "
        "sae_weights.safetensors) (site resid_pre, layer 0)",
    ),
    "no cfg.json": (
        {0: {"cfg.json": lambda p: p.rename(p.with_name("params.json"))}},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}: not a dictionary in SAELens's format (no "
        "cfg.json; SAE.save_model or save_inference_model writes cfg.json and "
        "sae_weights.safetensors) (site resid_pre, layer 0)",
    ),
    "cfg.json without d_in": (
        {0: {"cfg.json": lambda p: p.write_text(json.dumps({"d_sae": 8}))}},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}/cfg.json: not a SAELens SAE config (no integer "
        "d_in) (site resid_pre, layer 0)",
    ),
    "other weights": (
        {0: {"sae_weights.safetensors": lambda p: save_file({"w": torch.zeros(2)}, p)}},
        f"sae.pretrained.path: {{tmp}}/{LAYER0}/sae_weights.safetensors: no W_dec, W_enc tensor, "
        "so not a SAELens SAE's weights (site resid_pre, layer 0)",
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSALS))
def test_a_local_dictionary_that_does_not_fit_is_refused_when_the_config_resolves(
    run_inputs, tmp_path, case
):
    change, expected = CONFIG_REFUSALS[case]
    if any(isinstance(k, int) for k in change):
        pre = _local(tmp_path, change)
    else:
        pre = _local(tmp_path, **change)
    with pytest.raises(ConfigError) as err:
        resolved(run_inputs, pre)
    model = str(Path(run_inputs["model_name"]))
    assert str(err.value) == expected.format(tmp=tmp_path, model=model)


TEMPLATE_REFUSALS = [
    ({}, "sae.pretrained: sae.source pretrained needs release and sae_id"),
    (
        {"release": "gpt2-small-res-jb"},
        "sae.pretrained.sae_id: required with sae.pretrained.release",
    ),
    ({"sae_id": "blocks.{layer}.hook_resid_pre"}, "sae.pretrained.release: required with"),
    ({"path": "/d/{layer}", "release": "gpt2-small-res-jb"}, "sae.pretrained.path: give either"),
    ({"path": "/d/{layr}"}, "sae.pretrained.path: unknown placeholder {layr} in '/d/{layr}'"),
    ({"path": "/d/layer_0"}, "sae.pretrained.path: '/d/layer_0' has no {layer} but the config"),
    (
        {"release": "gpt2-smal-res-jb", "sae_id": "blocks.{layer}.hook_resid_pre"},
        "sae.pretrained.release: 'gpt2-smal-res-jb' is neither a SAELens pretrained release nor a "
        "Hugging Face repo id (org/name); did you mean gpt2-small-res-jb",
    ),
    (
        {"release": "gpt2-small-res-jb", "sae_id": "blocks.{layer}.hook_resid_mid"},
        "sae.pretrained.sae_id: 'blocks.0.hook_resid_mid' (site resid_pre, layer 0) is not in "
        "release gpt2-small-res-jb;",
    ),
    (
        {"release": "gpt2-small-res-jb", "sae_id": "blocks.{layer}.hook_resid_pre"},
        "sae.pretrained.sae_id: gpt2-small-res-jb blocks.0.hook_resid_pre: made for model "
        "'gpt2-small', not the run's model",
    ),
]


@pytest.mark.parametrize(("pre", "start"), TEMPLATE_REFUSALS)
def test_sae_pretrained_is_refused_in_one_line(run_inputs, pre, start):
    with pytest.raises(ConfigError) as err:
        resolved(run_inputs, pre)
    assert str(err.value).startswith(start) and "\n" not in str(err.value)


def test_pretrained_keys_need_the_pretrained_source(run_inputs):
    raw = base_config(
        run_inputs["model_name"], run_inputs["hf"], {"path": "/d/{layer}"}, source="capture"
    )
    with pytest.raises(
        ConfigError,
        match=r"^sae.pretrained.path: only used with sae.source "
        r"pretrained, not 'capture'$",
    ):
        cf_config.resolve(raw, REPO)


def test_a_relative_path_resolves_against_its_config_files_folder(run_inputs, tmp_path):
    _local(tmp_path)
    cfg_file = tmp_path / "run.yaml"
    raw = base_config(
        run_inputs["model_name"], run_inputs["hf"], {"path": "dicts/{site}/layer_{layer}"}
    )
    cfg_file.write_text(json.dumps(raw))
    config = cf_config.load(cfg_file, base_dir=REPO)
    assert config["sae"]["pretrained"]["path"] == str(tmp_path / "dicts/{site}/layer_{layer}")


def test_a_release_missing_from_the_cache_is_refused_saying_to_prefetch(run_inputs, tmp_path):
    """Resolving needs no cache (the prefetch has not run yet); the job, offline, refuses the
    dictionary in one line that says to run prefetch_saes, before loading the model."""
    pre = {"release": REPO_ID, "sae_id": "{site}/layer_{layer}"}
    config = resolved({**run_inputs, "hf": tmp_path / "empty"}, pre)
    with pytest.raises(InputError) as err:
        run_stage(run_inputs, config, 0, tmp_path / "out")
    assert str(err.value) == (
        f"sae.pretrained.sae_id: {REPO_ID} resid_pre/layer_0 (hub repo {REPO_ID}, folder "
        f"resid_pre/layer_0) is not in the Hugging Face cache {tmp_path / 'empty' / 'hub'}; run "
        "`snakemake prefetch_saes --configfile <your config>` on a machine with internet"
    )
    assert not (tmp_path / "out").exists()


def _poison(name: str, n: int, value: float):
    """An action for _local's layer_dirs: the first `n` values of tensor `name` set to `value`."""

    def action(path: Path) -> None:
        weights = load_file(path)
        weights[name].view(-1)[:n] = value
        save_file(weights, path)

    return action


def test_a_local_dictionary_with_nan_weights_is_refused_before_the_model_loads(
    run_inputs, tmp_path
):
    """The config check reads cfg.json and the weights' names; the job reads the values first,
    and refuses a NaN in one line naming the file and the tensor, before any work."""
    poisoned = {0: {"sae_weights.safetensors": _poison("W_dec", 2, float("nan"))}}
    config = resolved(run_inputs, _local(tmp_path, poisoned))
    with pytest.raises(InputError) as err:
        run_stage(run_inputs, config, 0, tmp_path / "out")
    layer0 = tmp_path / LAYER0
    assert str(err.value) == (
        f"sae.pretrained.path: {layer0}: {layer0 / 'sae_weights.safetensors'}: tensor 'W_dec' "
        "has 2 NaN values"
    )
    assert not (tmp_path / "out").exists()


def test_a_release_with_an_infinite_weight_is_refused_by_prefetch_saes(
    run_inputs, tmp_path, monkeypatch
):
    """prefetch_saes reads each release's weights as it fetches them and refuses an infinity in
    one line naming the release, the cached file and the tensor; it writes no prefetch.json."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the login node's cache, filled
    hf = tmp_path / "hf"
    saes = {
        f"resid_pre/layer_{layer}": build("topk", D, f"blocks.{layer}.hook_resid_pre", "tiny-gpt2")
        for layer in (0, 1)
    }
    repo = lay_out_cache(hf / "hub", REPO_ID, saes)
    weights = repo / "snapshots" / REVISION / "resid_pre" / "layer_1" / "sae_weights.safetensors"
    _poison("b_enc", 1, float("-inf"))(weights)
    config = resolved(
        {**run_inputs, "hf": hf}, {"release": REPO_ID, "sae_id": "{site}/layer_{layer}"}
    )
    with pytest.raises(InputError) as err:
        pretrained_stage.prefetch_stage(config, run_inputs["model_json"], tmp_path / "p.json")
    assert str(err.value) == (
        f"sae.pretrained.sae_id: {REPO_ID} resid_pre/layer_1: {weights}: tensor 'b_enc' has 1 "
        "infinite value"
    )
    assert not (tmp_path / "p.json").exists()


TINY_HUB = "circuitflow-test/tiny-gpt2"  # the tiny model's name on a hub, for model.same_as


def test_a_local_copy_of_a_dictionarys_model_is_accepted_with_model_same_as(
    run_inputs, tmp_path, monkeypatch
):
    """Dictionaries made for a hub model, on a local directory holding that model: refused
    naming model.same_as; accepted with it, checked against the model's config.json in the
    hub cache, by the config check and the job alike, and recorded in environment.json."""
    hf = tmp_path / "hf"
    repo = hf / "hub" / f"models--{TINY_HUB.replace('/', '--')}"
    (repo / "snapshots" / REVISION).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    hf_config = json.loads((Path(run_inputs["model_name"]) / "config.json").read_text())
    (repo / "snapshots" / REVISION / "config.json").write_text(json.dumps(hf_config))
    pre = _local(tmp_path, model_name=TINY_HUB)
    model = run_inputs["model_name"]
    with pytest.raises(ConfigError) as err:
        resolved({**run_inputs, "hf": hf}, pre)
    assert str(err.value) == (
        f"sae.pretrained.path: {tmp_path / LAYER0}: made for model '{TINY_HUB}', not the run's "
        f"model '{model}': set model.same_as: {TINY_HUB} if {model} is that model"
    )
    raw = base_config(model, hf, pre)
    raw["model"]["same_as"] = TINY_HUB
    notes = []
    config = cf_config.resolve(raw, REPO, notes=notes)
    # Every field known (the cache holds the model's config.json): no note of model.same_as.
    assert not [note for note in notes if "model.same_as" in note], notes
    metrics = run_stage(run_inputs, config, 1, tmp_path / "out")
    assert metrics["model_name"] == TINY_HUB and (tmp_path / "out" / "metrics.json").is_file()
    out = tmp_path / "provenance"  # the provenance rule's script, in this process
    monkeypatch.setattr(sys, "argv", [
        "provenance.py", "environment", "--config", json.dumps(cf_config.section(
            config, *config, same_as=True)), "--out-environment", str(out / "environment.json"),
        "--out-config", str(out / "config.resolved.yaml"),
    ])  # fmt: skip
    runpy.run_path(str(REPO / "scripts" / "provenance.py"), run_name="__main__")
    record = json.loads((out / "environment.json").read_text())["model_same_as"]
    assert record["model"] == model and record["same_as"] == TINY_HUB
    assert record["checked"] == {"architecture": "GPT2LMHeadModel", "d_model": D, "n_layers": 2,
                                 "d_vocab": 600}  # fmt: skip
    assert record["unchecked"] == [] and "Hugging Face cache" in record["sources"]["d_model"]


def test_the_job_refuses_what_the_config_could_not_check(run_inputs, tmp_path):
    """A hub model's d_model is not known when the config resolves; the job reads it from
    model.json and refuses a dictionary of another width before any work, in one line, through
    the stage script (exit status 2)."""
    hf = tmp_path / "hf"
    lay_out_cache(
        hf / "hub",
        JB_REPO,
        {
            f"blocks.{layer}.hook_resid_pre": build(
                "standard", 16, f"blocks.{layer}.hook_resid_pre", "gpt2-small"
            )
            for layer in (0, 1)
        },
    )
    pre = {"release": "gpt2-small-res-jb", "sae_id": "blocks.{layer}.hook_resid_pre"}
    config = resolved({**run_inputs, "hf": hf}, pre, model_name="gpt2")  # d_model unknown here
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "pretrained_sae.py"),
            "--config",
            json.dumps(config),
            "--members",
            "resid_pre:0",
            "--model-json",
            str(run_inputs["model_json"]),
            "--tokens-npy",
            str(run_inputs["npy"]),
            "--tokens-json",
            str(run_inputs["json"]),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].endswith(
        "sae.pretrained.sae_id: gpt2-small-res-jb blocks.0.hook_resid_pre: d_in 16 is not the "
        "model's d_model 32"
    ), done.stderr
    assert not (tmp_path / "out").exists()


def test_a_token_set_of_another_model_is_refused(run_inputs, tmp_path):
    meta = json.loads(run_inputs["json"].read_text()) | {"model_hash": "0" * 64}
    (tmp_path / "tokens.json").write_text(json.dumps(meta))
    config = resolved(run_inputs, _local(tmp_path))
    with pytest.raises(InputError, match=r"tokens.json: a token set for another model"):
        pretrained_stage.run(
            config,
            "resid_pre",
            0,
            run_inputs["model_json"],
            run_inputs["npy"],
            tmp_path / "tokens.json",
            tmp_path / "out",
        )


# --- a group's job --------------------------------------------------------------------------------
TIMING = ("wall_time_s", "peak_memory_mb")  # a job's own: the rest of metrics.json is the same


def test_a_group_job_writes_each_member_as_its_own_job_would(run_inputs, tmp_path):
    """pretrained_sae evaluates a group's dictionaries one after another with the model loaded
    once: each member's directory holds the weights and the metrics.json (the same keys and
    values, but for its time and memory) that a job of its own writes."""
    config = resolved(run_inputs, _local(tmp_path, seed=7))
    members = [("resid_pre", 0), ("resid_pre", 1)]
    outs = [tmp_path / "group" / f"layer_{layer}" for _, layer in members]
    grouped = pretrained_stage.run_group(
        config, members, run_inputs["model_json"], run_inputs["npy"], run_inputs["json"], outs
    )
    assert list(grouped) == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    for (site, layer), out in zip(members, outs, strict=True):
        alone_dir = tmp_path / "alone" / f"layer_{layer}"
        alone = run_stage(run_inputs, config, layer, alone_dir, site)
        together = json.loads((out / "metrics.json").read_text())
        assert together == grouped[f"blocks.{layer}.hook_resid_pre"]
        assert together.keys() == alone.keys()
        assert {k: v for k, v in together.items() if k not in TIMING} == {
            k: v for k, v in alone.items() if k not in TIMING
        }
        assert_same_weights(SAE.load_from_disk(out), SAE.load_from_disk(alone_dir))
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in alone_dir.iterdir())


def test_a_group_refuses_a_member_that_does_not_fit_before_any_work(run_inputs, tmp_path):
    """A local dictionary of the group that does not fit is refused, in one line naming it,
    before the model loads: no member's directory is written."""
    wide = build("topk", 2 * D, "blocks.1.hook_resid_pre", "tiny-gpt2")
    config = resolved(run_inputs, _local(tmp_path))
    save(wide, tmp_path / "dicts" / "resid_pre" / "layer_1")  # replaces layer 1's
    outs = [tmp_path / "out" / f"layer_{layer}" for layer in (0, 1)]
    with pytest.raises(InputError, match=rf"layer_1: d_in {2 * D} is not the model's d_model"):
        pretrained_stage.run_group(
            config, [("resid_pre", 0), ("resid_pre", 1)], run_inputs["model_json"],
            run_inputs["npy"], run_inputs["json"], outs,
        )  # fmt: skip
    assert not (tmp_path / "out").exists()


# --- the job's plan -------------------------------------------------------------------------------
def test_the_jobs_plan_follows_the_dictionarys_own_width(run_inputs, tmp_path):
    """pretrained_sae's memory and work grow with the width in the dictionary's cfg.json, not
    with the config's sae.expansion_factor."""
    narrow = resolved(run_inputs, _local(tmp_path / "narrow"))
    wide = resolved(run_inputs, _local(tmp_path / "wide", n_dead=4096))
    assert description.describe(narrow).widest() == 2 * D
    assert description.describe(wide).widest() == 2 * D + 4096
    for config in (narrow, wide):
        assert config["sae"]["expansion_factor"] == narrow["sae"]["expansion_factor"]
    work = {
        n: resources.job_work(c, "pretrained_sae").flops["float32"]
        for n, c in (("narrow", narrow), ("wide", wide))
    }
    assert work["wide"] > 2 * work["narrow"]
    assert resources.mem_mb(wide, "pretrained_sae") > resources.mem_mb(narrow, "pretrained_sae")
    assert resources.gpus(narrow, "pretrained_sae") == 0  # device: cpu
    assert resources.job_work(narrow, "prefetch_saes") is None


def test_a_group_jobs_plan_is_its_members(run_inputs, tmp_path):
    """The rule table plans a group's job (its key, as the rule passes it) from its members:
    their work summed, the memory of its widest one (one dictionary at a time)."""
    config = resolved(run_inputs, _local(tmp_path))
    wide = build("topk", D, "blocks.1.hook_resid_pre", "tiny-gpt2", n_dead=4096)
    save(wide, tmp_path / "dicts" / "resid_pre" / "layer_1")  # layer 1 wider than layer 0
    group, alone = "resid_pre:0,resid_pre:1", ["resid_pre:0", "resid_pre:1"]
    flops = [resources.job_work(config, "pretrained_sae", j).flops["float32"] for j in alone]
    together = resources.job_work(config, "pretrained_sae", group).flops["float32"]
    assert together == pytest.approx(sum(flops)) and flops[1] > 2 * flops[0]
    mem = [resources.mem_mb(config, "pretrained_sae", 1, j) for j in alone]
    assert mem[1] > mem[0] and resources.mem_mb(config, "pretrained_sae", 1, group) == mem[1]


def test_published_dictionaries_are_grouped_as_streaming_groups_them():
    """GPT-2 small with gpt2-small-res-jb on an A100 with CSD3's 36-hour cap: the 12
    dictionaries in one job (`sae.stream.layers_per_job: auto`), a short one; a number splits
    them as it splits streamed layers; one a job on the CPU, or where the cap leaves no room."""
    from circuitflow import stream_groups
    from circuitflow.cluster import Cluster

    config = cf_config.load(REPO / "config" / "gpt2-small-res-jb.yaml")
    csd3 = Cluster(gpu_type="A100", max_runtime=2160, gpu_partition="ampere")
    (group,) = stream_groups.stream_groups(config, csd3)
    assert group.members == tuple(("resid_pre", layer) for layer in range(12))
    assert group.name == "resid_pre_layer_0_to_11"
    assert resources.runtime(config, "pretrained_sae", 1, csd3, group.key) <= 15
    fours = {**config, "sae": {**config["sae"], "stream": {"layers_per_job": 4}}}
    assert [g.name for g in stream_groups.stream_groups(fours, csd3)] == [
        "resid_pre_layer_0_to_3",
        "resid_pre_layer_4_to_7",
        "resid_pre_layer_8_to_11",
    ]
    assert len(stream_groups.stream_groups({**config, "device": "cpu"}, csd3)) == 12
    no_room = Cluster(
        gpu_type="A100", max_runtime=10, gpu_partition="ampere"
    )  # the start-up allowance alone
    assert len(stream_groups.stream_groups(config, no_room)) == 12


def test_the_hub_context_restores_huggingface_hubs_settings(tmp_path):
    from huggingface_hub import constants

    before = (constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE, os.environ.get("HF_HOME"))
    with pretrained.hub(str(tmp_path), offline=True) as cache:
        assert cache == tmp_path / "hub" and constants.HF_HUB_OFFLINE is True
        assert os.environ["HF_HOME"] == str(tmp_path)
    assert (constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE, os.environ.get("HF_HOME")) == before


def test_the_ready_gpt2_config_names_every_layers_published_dictionary():
    """config/gpt2-small-res-jb.yaml resolves offline (nothing cached yet) to one dictionary of
    the release per layer, at site resid_pre."""
    import yaml

    raw = yaml.safe_load((REPO / "config" / "gpt2-small-res-jb.yaml").read_text())
    raw["model"]["hf_cache"] = "/nonexistent-cache"  # nothing fetched yet
    config = cf_config.resolve(raw, REPO)
    found = pretrained.dictionaries(config)
    assert [(d.site, d.layer, d.sae_id) for d in found] == [
        ("resid_pre", layer, f"blocks.{layer}.hook_resid_pre") for layer in range(12)
    ]
    rel = pretrained.resolve_release("gpt2-small-res-jb", found[3].sae_id)
    assert (rel.repo_id, rel.folder, rel.model) == (
        JB_REPO,
        "blocks.3.hook_resid_pre",
        "gpt2-small",
    )
    assert rel.model_kwargs == {"center_writing_weights": True}
