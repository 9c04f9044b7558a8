"""Config validation: the schema, defaults, layer specs and semantic checks."""

from __future__ import annotations

import pytest
import yaml
from helpers.dag import REPO, run_snakemake

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
    "k above the SAE's width": (
        {"sae": {"k": 100000, "d_sae": 64}},
        ["sae.k: 100000", "cannot exceed", "sae.d_sae = 64"],
    ),
    "k above the width from the expansion factor": (
        {"sae": {"k": 600}},
        ["sae.k: 600", "sae.expansion_factor * the model's d_model = 512"],
    ),
    "target_l0 not below the SAE's width": (
        {"sae": {"architecture": "jumprelu", "d_sae": 16}},
        ["sae.target_l0: 16", "below the SAE's width"],
    ),
    "SAE batch above total_tokens": (
        {"sae": {"batch_size": 4096, "total_tokens": 2048}},
        ["sae.batch_size: 4096", "sae.total_tokens (2048)"],
    ),
    "SAE batch above the captured rows": (
        {"sae": {"batch_size": 1 << 20, "total_tokens": 1 << 21}},
        ["sae.batch_size: 1048576", "capture.n_tokens = 262144"],
    ),
    "capture context beyond the model": (
        {"capture": {"context_length": 64}},
        ["capture.context_length: 64", "model's context (32 tokens)"],
    ),
    "capture tokens below one context": (
        {"capture": {"n_tokens": 16}, "sae": {"batch_size": 8, "total_tokens": 16}},
        ["capture.n_tokens: 16", "less than one context"],
    ),
    "more capture shards than checkpoint units": (
        {"capture": {"shards": 64, "n_tokens": 8192}, "sae": {"batch_size": 512}},
        ["capture.shards: 64", "checkpoint units"],
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


# --- one source of defaults --------------------------------------------------------------------
def _plain(value):
    """Tuples as lists, so a dataclass's tuple default compares with the schema's list."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _dataclass_defaults(cls) -> dict:
    import dataclasses

    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = (
                _dataclass_defaults(type(value)) if dataclasses.is_dataclass(value) else value
            )
    return out


def _sections():
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.capture.stage import CaptureOptions
    from circuitflow.interventions.config import InterventionsConfig
    from circuitflow.model.embedded import ArchitectureConfig, TrainingConfig
    from circuitflow.model.language import LanguageConfig
    from circuitflow.sae.config import SAETrainConfig

    return {
        "attribution": AttributionConfig,
        "interventions": InterventionsConfig,
        "sae": SAETrainConfig,
        "capture": CaptureOptions,
        "embedded.architecture": ArchitectureConfig,
        "embedded.training": TrainingConfig,
        "embedded.language": LanguageConfig,
    }


@pytest.mark.parametrize("section", sorted(_sections()))
def test_dataclass_defaults_are_the_schemas(section):
    """Every field a config section's dataclass shares with the schema has the schema's
    default (the dataclasses are used by the library and the tests; the stages get the
    resolved config, so a drift would make the two disagree silently)."""
    schema = cf.schema_defaults(section)
    ours = _dataclass_defaults(_sections()[section])
    shared = set(schema) & set(ours)
    # What a dataclass may hold beyond the schema: the master seed and device it is given.
    assert set(ours) - set(schema) <= {"seed", "device"}, set(ours) - set(schema)
    assert {k: ours[k] for k in shared} == {k: schema[k] for k in shared}


def test_config_yaml_holds_only_schema_defaults():
    """config/config.yaml documents the embedded default: every value it sets is the schema's
    default, so a --configfile that sets nothing else reproduces it."""
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    defaults = cf.schema_defaults()

    def walk(node, default, path):
        for key, value in node.items():
            here = f"{path}.{key}" if path else key
            if isinstance(value, dict) and key != "behaviours":
                walk(value, default[key], here)
            else:
                assert value == default[key], f"{here}: {value!r} != schema {default[key]!r}"

    walk(raw, defaults, "")


def test_a_config_with_only_outdir_resolves_to_the_default_run():
    default = cf.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()), REPO)
    elsewhere = cf.resolve({"outdir": "elsewhere"}, REPO)
    assert elsewhere.pop("outdir") == "elsewhere"
    default.pop("outdir")
    assert elsewhere == default
    assert elsewhere["embedded"]["architecture"]["active_heads"] == [2, 1]


def test_active_heads_auto_follows_the_architecture():
    resolved = cf.resolve({"embedded": {"architecture": {"n_layers": 3}}}, REPO)
    assert resolved["embedded"]["architecture"]["active_heads"] == [2, 1, 1]
    one_head = {"n_layers": 2, "n_heads": 1, "d_head": 64}
    resolved = cf.resolve({"embedded": {"architecture": one_head}}, REPO)
    assert resolved["embedded"]["architecture"]["active_heads"] == [1, 1]


def test_registries_and_schema_enums_agree():
    from circuitflow.prompts import SOURCES
    from circuitflow.sae.architectures import ARCHITECTURES
    from circuitflow.sae.config import TRAINERS

    schema = cf.load_schema()["properties"]
    source = schema["behaviours"]["additionalProperties"]["properties"]["source"]
    assert source["enum"] == list(SOURCES)
    assert schema["sae"]["properties"]["architecture"]["enum"] == list(ARCHITECTURES)
    assert schema["sae"]["properties"]["trainer"]["enum"] == list(TRAINERS)
