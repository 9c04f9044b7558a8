"""Config validation: the schema, defaults, layer specs and semantic checks."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, run_snakemake

from circuitflow import config as cf


def test_default_config_resolves_with_every_default_filled():
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    resolved = cf.resolve(raw, REPO)
    assert resolved["layers"] == [0, 1]
    assert resolved["baseline"]["batch_size"] == 64
    assert resolved["embedded"]["training"]["weight_decay"] == 0.01
    assert set(resolved["behaviours"]) == {"induction", "facts"}


def test_every_schema_key_has_description_and_default():
    schema = cf.load_schema()

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            here = f"{path}.{key}" if path else key
            assert "description" in sub, f"{here} has no description"
            assert "default" in sub or here.endswith(".source"), f"{here} has no default"
            walk(sub, here)

    walk(schema, "")


@pytest.mark.parametrize(
    "spec, n_layers, expected",
    [("all", 3, [0, 1, 2]), (1, 3, [1]), ([2, 0], 3, [0, 2]), ("1-3", 5, [1, 2, 3]), ("2", 3, [2])],
)
def test_layer_specs(spec, n_layers, expected):
    assert cf.parse_layers(spec, n_layers) == expected


# Each bad config, and words its one-line message must contain (the key, and what is allowed).
BAD_CONFIGS = {
    "wrong type": ({"seed": "zero"}, ["seed", "not of type"]),
    "unknown top-level key": ({"sead": 1}, ["unknown key sead", "allowed keys", "seed"]),
    "unknown nested key": ({"model": {"nmae": "gpt2"}}, ["unknown key model.nmae", "name"]),
    "layer outside model": ({"layers": [0, 7]}, ["layers", "layer 7", "allowed layers: 0-1"]),
    "empty layer range": ({"layers": "3-1"}, ["layers", "empty"]),
    "malformed layer range": ({"layers": "first"}, ["layers", "'first'", "range like"]),
    "unknown site": ({"sites": ["resid_middle"]}, ["sites.0", "resid_middle", "resid_post"]),
    "unknown behaviour source": (
        {"behaviours": {"x": {"source": "telepathy"}}},
        ["behaviours.x.source", "telepathy", "allowed values", "induction"],
    ),
    "source for another model kind": (
        {"behaviours": {"x": {"source": "ioi"}}},
        ["behaviours.x.source", "ioi", "embedded model", "induction, facts, file"],
    ),
    "missing prompt file": (
        {"behaviours": {"x": {"source": "file", "path": "no/such.csv"}}},
        ["behaviours.x.path", "no/such.csv", "does not exist"],
    ),
    "bad dtype": ({"model": {"dtype": "float8"}}, ["model.dtype", "float8", "bfloat16"]),
    "bad device": ({"device": "tpu"}, ["device", "tpu", "cuda"]),
    "negative count": (
        {"behaviours": {"x": {"source": "facts", "n_prompts": 0}}},
        ["behaviours.x.n_prompts", "minimum"],
    ),
    "heads do not tile d_model": (
        {"embedded": {"architecture": {"d_head": 10}}},
        ["embedded.architecture.d_head", "n_heads * d_head"],
    ),
    "unknown model name": (
        {"model": {"name": "not-a-model-xyz"}},
        ["model.name", "not-a-model-xyz", "TransformerLens model name"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_names_the_key(case):
    raw, words = BAD_CONFIGS[case]
    with pytest.raises(cf.ConfigError) as info:
        cf.resolve(raw, REPO)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_snakemake_stops_on_bad_config_with_one_clear_line(tmp_path):
    """Through the real CLI: non-zero exit, the message names the key, nothing is computed."""
    done = run_snakemake({"layers": [5]}, tmp_path, "-n", check=False)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "config error: layers: layer 5 is outside the model; allowed layers: 0-1" in output
    assert not (tmp_path / "results").exists()


def test_ready_configs_for_real_models_resolve_offline():
    for name, n_layers in (("gpt2-small", 12), ("qwen2.5-0.5b", 24)):
        raw = yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text())
        resolved = cf.resolve(raw, REPO)
        assert resolved["layers"] == list(range(n_layers))
        assert set(resolved["behaviours"]) == {"ioi", "capitals"}
