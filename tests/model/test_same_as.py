"""model.same_as: a local directory declared a copy of a named model, checked offline against
what is known of that model (the Hugging Face cache, circuitflow's table of shapes,
TransformerLens's registry), refused in one line where it differs or nothing is known."""

from __future__ import annotations

import json

import pytest
from helpers.dag import REPO

from circuitflow.errors import ConfigError
from circuitflow.model import same_as

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
         "num_hidden_layers": 28, "vocab_size": 151936}  # fmt: skip


def local(tmp_path, **fields):
    """A local Hugging Face directory: its config.json alone is what the check reads."""
    folder = tmp_path / "snapshot"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3 | fields))
    return folder


def config(name, same, hf_cache=None):
    return {"model": {"name": str(name), "same_as": same, "hf_cache": hf_cache}}


def test_a_snapshot_of_qwen3_is_that_model_by_circuitflows_table(tmp_path):
    folder = local(tmp_path)
    record, notes = same_as.check(config(folder, "Qwen/Qwen3-0.6B", str(tmp_path / "no-cache")))
    assert record["checked"] == {"architecture": "Qwen3ForCausalLM", "d_model": 1024,
                                 "n_layers": 28, "d_vocab": 151936}  # fmt: skip
    assert record["unchecked"] == [] and notes == []
    assert set(record["sources"].values()) == {"circuitflow's table of model shapes"}
    assert same_as.check(config(folder, None)) == (None, [])


def test_a_directory_that_differs_is_refused_naming_the_field(tmp_path):
    folder = local(tmp_path, hidden_size=896)
    with pytest.raises(ConfigError) as err:
        same_as.check(config(folder, "Qwen/Qwen3-0.6B", str(tmp_path / "no-cache")))
    assert str(err.value) == (
        f"model.same_as: Qwen/Qwen3-0.6B: {folder} is not that model: its d_model is 896 "
        f"({folder / 'config.json'}), Qwen/Qwen3-0.6B's 1024 (circuitflow's table of model "
        "shapes)"
    )
    checkpoint = REPO / ".test" / "tl-toy"  # a TransformerLens checkpoint: its tl_config.json
    with pytest.raises(ConfigError, match=r"tl-toy is not that model: its d_model is 48 \(.*"
                       r"tl_config\.json\), Qwen/Qwen3-0\.6B's 1024"):  # fmt: skip
        same_as.check(config(checkpoint, "Qwen/Qwen3-0.6B", str(tmp_path / "no-cache")))


def test_what_cannot_be_known_offline_is_a_note_and_nothing_known_is_refused(tmp_path):
    """openai-community/gpt2 is in TransformerLens's registry (its architecture) but in no
    table of shapes and not in the cache: the architecture is checked, the rest is said to be
    unchecked. A name nothing knows is refused."""
    gpt2 = local(tmp_path, architectures=["GPT2LMHeadModel"])
    record, notes = same_as.check(config(gpt2, "openai-community/gpt2", str(tmp_path / "none")))
    assert record["checked"] == {"architecture": "GPT2LMHeadModel"}
    assert record["unchecked"] == ["d_model", "layers", "vocabulary"]
    assert notes == [
        f"config note: model.same_as: openai-community/gpt2: {gpt2} checked on its "
        "architecture; its d_model, layers and vocabulary could not be known offline, so not "
        "checked"
    ]
    with pytest.raises(ConfigError, match=r"^model\.same_as: someone/unknown-model: nothing is "
                       r"known of that model offline to check .*snapshot against"):  # fmt: skip
        same_as.check(config(gpt2, "someone/unknown-model", str(tmp_path / "none")))


@pytest.mark.parametrize("name", ["embedded", "gpt2"])
def test_same_as_is_for_local_directories_only(name):
    with pytest.raises(ConfigError, match=rf"^model\.same_as: gpt2: only for a local model "
                       rf"directory \(model\.name\), and '{name}' is not one"):  # fmt: skip
        same_as.check(config(name, "gpt2"))


def test_the_config_check_runs_it(tiny_hf_model_dir):
    """config.resolve checks model.same_as before any job: the tiny GPT-2 is not Qwen3."""
    from circuitflow import config as cf

    raw = {
        "model": {"name": str(tiny_hf_model_dir), "same_as": "Qwen/Qwen3-0.6B"},
        "behaviours": {"ioi": {"source": "ioi"}},
        "capture": {"corpus": "corpus.txt"},
    }
    with pytest.raises(ConfigError) as err:
        cf.resolve(raw, ".")
    assert str(err.value).startswith(
        f"model.same_as: Qwen/Qwen3-0.6B: {tiny_hf_model_dir} is not that model: its "
        "architecture is 'GPT2LMHeadModel'"
    ), str(err.value)


def test_rules_params_hold_same_as_only_where_it_is_read():
    """The model section the rules pass holds model.same_as only for the rules that read it
    and only where it is set: a run computed before the key existed is not rerun for it, nor
    are the model, baseline or capture jobs when it is set (Snakemake compares params)."""
    from circuitflow import config as cf

    resolved = cf.resolve({})
    assert resolved["model"]["same_as"] is None and "same_as" in resolved["model"]
    for wanted in (False, True):
        assert "same_as" not in cf.section(resolved, "model", "seed", same_as=wanted)["model"]
    given = {**resolved, "model": {**resolved["model"], "same_as": "gpt2"}}
    assert cf.section(given, "model")["model"] == cf.section(resolved, "model")["model"]
    assert cf.section(given, "model", same_as=True)["model"]["same_as"] == "gpt2"
