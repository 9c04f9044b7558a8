"""Config validation: the schema, defaults, layer specs and semantic checks."""

from __future__ import annotations

import re

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


def test_a_run_of_both_kinds_splices_its_saes_and_trains_a_transcoder_per_layer():
    """sae.kind both: the SAEs at `sites` are what attribution splices; the transcoders add
    mlp_out to the dictionaries and mlp_in and mlp_out to what capture writes; the memory
    planners count each accordingly."""
    from circuitflow.memory import n_dictionaries, n_hooks, n_transcoders
    from circuitflow.sites import capture_sites, dictionary_kind, dictionary_sites, sae_sites

    both = cf.resolve({"sites": ["resid_pre", "resid_post"], "sae": {"kind": "both"}})
    assert sae_sites(both) == ["resid_pre", "resid_post"]
    assert dictionary_sites(both) == ["resid_pre", "resid_post", "mlp_out"]
    assert capture_sites(both) == ["mlp_in", "resid_pre", "resid_post", "mlp_out"]
    assert [dictionary_kind(both, s) for s in ("resid_post", "mlp_out")] == ["sae", "transcoder"]
    assert (n_hooks(both), n_dictionaries(both), n_transcoders(both)) == (4, 6, 2)
    alone = cf.resolve({"sites": ["mlp_out"], "sae": {"kind": "transcoder"}})
    assert sae_sites(alone) == [] and dictionary_sites(alone) == ["mlp_out"]
    assert capture_sites(alone) == ["mlp_in", "mlp_out"]
    assert (n_hooks(alone), n_dictionaries(alone), n_transcoders(alone)) == (0, 2, 2)
    plain = cf.resolve({"sae": {"kind": "sae"}})
    assert dictionary_kind(plain, "mlp_out") == "sae" and n_transcoders(plain) == 0


def test_kind_auto_is_both_on_the_embedded_model_only():
    """sae.kind auto (the default): SAEs and transcoders on the embedded model, SAEs alone on
    a real model, with published dictionaries, or where a site is mlp_out."""
    assert cf.resolve({})["sae"]["kind"] == "both"
    assert cf.resolve({"sites": ["mlp_out"]})["sae"]["kind"] == "sae"
    gpt2 = yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text())
    gpt2.get("sae", {}).pop("kind", None)
    assert cf.resolve(gpt2, REPO)["sae"]["kind"] == "sae"
    assert cf.resolve({"sae": {"kind": "transcoder"}, "sites": ["mlp_out"]})["sae"]["kind"] == (
        "transcoder"
    )


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
    "transcoders at a residual site": (
        {"sae": {"kind": "transcoder"}},
        ["sites: ['resid_post'] with sae.kind transcoder", "set sites: [mlp_out]"],
    ),
    "published transcoders named nowhere": (
        {"sites": ["mlp_out"], "sae": {"kind": "transcoder", "source": "pretrained"}},
        ["sae.pretrained: sae.source pretrained needs release and sae_id", "or path"],
    ),
    "SAEs and transcoders both at mlp_out": (
        {"sites": ["resid_post", "mlp_out"], "sae": {"kind": "both"}},
        ["sites: ['resid_post', 'mlp_out'] with sae.kind both", "leave mlp_out out of sites"],
    ),
    "transcoders apart without sae.kind both": (
        {"sae": {"kind": "sae", "transcoders": {"source": "pretrained"}}},
        ["sae.transcoders.source: only with sae.kind both", "not sae"],
    ),
    "capture and stream in one run": (
        {"sae": {"kind": "both", "transcoders": {"source": "stream"}}},
        ["sae.transcoders.source: stream with sae.source capture", "take both from the same"],
    ),
    "published transcoders named nowhere beside trained SAEs": (
        {"sae": {"kind": "both", "transcoders": {"source": "pretrained"}}},
        ["sae.transcoders: sae.transcoders.source pretrained needs release and sae_id"],
    ),
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
    "fast trainer for an architecture it cannot train": (
        {"sae": {"architecture": "standard", "trainer": "fast"}},
        ["sae.trainer: fast trains topk, batchtopk only, not standard", "use auto or saelens"],
    ),
    "gpu trainer for an architecture it cannot train": (
        {"sae": {"architecture": "jumprelu", "trainer": "gpu"}},
        ["sae.trainer: gpu trains topk, batchtopk only, not jumprelu", "use auto or saelens"],
    ),
    "unknown key in a nested section": (
        {"sae": {"controller": {"kd": 1}}},
        ["unknown key sae.controller.kd; allowed keys: coef_max, coef_min, ema, ki, kp"],
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


# --- notes: what a valid config does only in part, one line each, printed by the dry run ------
def notes_of(raw: dict, **kw) -> list[str]:
    notes: list[str] = []
    cf.resolve(raw, REPO, notes=notes, **kw)
    return notes


def test_prompt_graphs_without_transcoders_say_why_none_is_drawn():
    """attribution.prompt_graphs set with sae.kind sae: no graph, and one line saying why; its
    default (on) is not the user's asking, so a default run says nothing."""
    assert notes_of({"attribution": {"prompt_graphs": 8}, "sae": {"kind": "sae"}}) == [
        "config note: attribution.prompt_graphs: 8 draws no per-prompt graph: the graphs are "
        "drawn on transcoders and sae.kind is sae; set sae.kind both (SAEs and transcoders) or "
        "transcoder"
    ]
    assert notes_of({}) == []
    assert notes_of({"attribution": {"prompt_graphs": 0}}) == []
    assert notes_of({"attribution": {"prompt_graphs": 8}, "sae": {"kind": "both"}}) == []
    # Through Snakemake, the files it merged decide who set the key (not the merged config).
    files = [REPO / "config" / "config.yaml"]
    set_it = {"attribution": {"prompt_graphs": 8}, "sae": {"kind": "sae"}}
    assert notes_of(set_it, config_files=files) == []
    assert len(notes_of(set_it, config_files=files, overrides=set_it)) == 1
    # Published dictionaries may be transcoders too: the way to graphs is the same.
    pretrained = cf.resolve({"sae": {"kind": "sae"}}, REPO)
    pretrained["sae"]["source"] = "pretrained"
    (line,) = cf.prompt_graph_notes(pretrained, 2, user_set=True)
    assert line.endswith("set sae.kind both (SAEs and transcoders) or transcoder")


@pytest.mark.parametrize("kind, sites", [("both", ["resid_post"]), ("transcoder", ["mlp_out"])])
def test_transcoders_at_some_layers_warn_that_the_other_mlps_are_whole_errors(kind, sites):
    """The per-prompt graphs replace only the MLPs of `layers`: the others are error nodes
    holding their whole output, which caps the replacement score: one line says so."""
    arch = {"n_layers": 6, "n_heads": 4, "d_head": 16}
    raw = {"embedded": {"architecture": arch}, "sites": sites, "sae": {"kind": kind}}
    assert notes_of({**raw, "layers": "all"}) == []
    assert notes_of({**raw, "layers": [0, 1, 3]}) == [
        "config warning: layers: transcoders at layers 0-1, 3 of 6 only; the per-prompt graphs "
        "(attribution.prompt_graphs) hold the MLPs of layers 2, 4-5 as whole error nodes, "
        "which caps their replacement score: set layers: all to replace every MLP"
    ]
    assert notes_of({**raw, "layers": [0], "attribution": {"prompt_graphs": 0}}) == []


def test_dry_run_prints_a_note_once(tmp_path):
    """The notes reach the user through Snakemake's CLI, once (the main process only)."""
    done = run_snakemake(
        {"attribution": {"prompt_graphs": 8}, "sae": {"kind": "sae"}}, tmp_path, "-n"
    )
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "config note:" in ln]
    assert lines == [
        "config note: attribution.prompt_graphs: 8 draws no per-prompt graph: the graphs are "
        "drawn on transcoders and sae.kind is sae; set sae.kind both (SAEs and transcoders) or "
        "transcoder"
    ]
    assert re.search(r"(?m)^attribution\s+2$", done.stdout), done.stdout[-2000:]
    assert not re.search(r"(?m)^prompt_graphs\s+\d+$", done.stdout)


def test_ready_configs_for_real_models_resolve_offline():
    for name, n_layers in (("gpt2-small", 12), ("qwen2.5-0.5b", 24)):
        raw = yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text())
        resolved = cf.resolve(raw, REPO)
        assert resolved["layers"] == list(range(n_layers))
        assert set(resolved["behaviours"]) == {"ioi", "capitals"}


# --- one source of keys and defaults: the schema; one helper builds the typed sections --------
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
    from circuitflow.baseline import BaselineConfig
    from circuitflow.capture.config import CaptureConfig
    from circuitflow.features.config import FeaturesConfig
    from circuitflow.interventions.config import InterventionsConfig
    from circuitflow.model.embedded import ArchitectureConfig, EmbeddedModelConfig, TrainingConfig
    from circuitflow.model.language import LanguageConfig
    from circuitflow.prompts import BehaviourConfig
    from circuitflow.sae.config import JumpReLUConfig, SAETrainConfig
    from circuitflow.sae.sparsity import SparsityControllerConfig

    return {
        "attribution": AttributionConfig,
        "baseline": BaselineConfig,
        "behaviours.<name>": BehaviourConfig,
        "interventions": InterventionsConfig,
        "sae": SAETrainConfig,
        "sae.controller": SparsityControllerConfig,
        "sae.jumprelu": JumpReLUConfig,
        "capture": CaptureConfig,
        "features": FeaturesConfig,
        "embedded": EmbeddedModelConfig,
        "embedded.architecture": ArchitectureConfig,
        "embedded.training": TrainingConfig,
        "embedded.language": LanguageConfig,
    }


@pytest.mark.parametrize("section", sorted(_sections()))
def test_section_dataclasses_hold_the_schemas_keys_and_defaults(section):
    """Each config section's dataclass has a field for every key of its schema section and no
    other but the master seed and device it is given, and the schema's default for each (the
    dataclasses are built with those defaults by tests and benchmarks; the stages build them
    from the resolved config with `typed`)."""
    import dataclasses

    from circuitflow.schema import schema_node

    cls = _sections()[section]
    keys = set(schema_node(section)["properties"])
    fields = {f.name for f in dataclasses.fields(cls)}
    assert keys <= fields and fields - keys <= {"seed", "device"}, fields ^ keys
    # Nested sections (sae.controller, embedded.language) are cases of their own.
    schema = {k: v for k, v in cf.schema_defaults(section).items() if not isinstance(v, dict)}
    ours = _dataclass_defaults(cls)
    assert {k: ours[k] for k in schema} == schema
    top = cf.schema_defaults()
    assert {k: ours[k] for k in fields - keys} == {k: top[k] for k in fields - keys}


def test_stages_typed_sections_of_the_default_config_are_the_defaults():
    """The default run's sections, built the way the stages build them, equal the dataclasses'
    defaults: one set of defaults, whichever way a section is made."""
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.baseline import BaselineConfig
    from circuitflow.capture.config import CaptureConfig
    from circuitflow.interventions.config import InterventionsConfig
    from circuitflow.model.embedded import ArchitectureConfig, EmbeddedModelConfig
    from circuitflow.sae.config import SAETrainConfig

    resolved = cf.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()), REPO)
    assert AttributionConfig.from_dict(resolved["attribution"]) == AttributionConfig()
    assert InterventionsConfig.from_dict(resolved["interventions"]) == InterventionsConfig()
    assert CaptureConfig.from_dict(resolved["capture"]) == CaptureConfig()
    assert BaselineConfig.from_dict(resolved["baseline"]) == BaselineConfig()
    # sae.kind auto is resolved by config.resolve: both kinds on the embedded model.
    assert SAETrainConfig.from_config(resolved) == SAETrainConfig(kind="both")
    embedded = EmbeddedModelConfig.from_config(resolved)
    # `auto` is resolved to a list by config.resolve, and a list becomes the field's tuple.
    auto = ArchitectureConfig().kept_heads()
    assert embedded.architecture.active_heads == auto == (2, 1)
    assert embedded == EmbeddedModelConfig(architecture=ArchitectureConfig(active_heads=auto))


def test_typed_fills_unset_keys_from_the_schema():
    """`typed` takes what a section leaves out from the schema, not from the dataclass: a
    dataclass without defaults is built whole from a partial section."""
    import dataclasses

    @dataclasses.dataclass
    class Bare:
        batch_size: int
        calibration_bins: int

    built = cf.typed(Bare, {"batch_size": 8}, "baseline")
    assert built == Bare(8, cf.schema_defaults("baseline")["calibration_bins"])
    assert cf.typed(Bare, None, "baseline") == Bare(**cf.schema_defaults("baseline"))


def test_typed_builds_nested_sections_tuples_and_extras():
    from circuitflow.interventions.config import InterventionsConfig
    from circuitflow.model.embedded import EmbeddedModelConfig
    from circuitflow.sae.config import SAETrainConfig

    sae = SAETrainConfig.from_dict({"controller": {"kp": 2}}, device="cpu", seed=5)
    assert (
        sae.controller.kp == 2
        and sae.controller.ki == cf.schema_defaults("sae")["controller"]["ki"]
    )
    assert (sae.device, sae.seed) == ("cpu", 5)
    alphas = InterventionsConfig.from_dict({"steering_alphas": [1, -2]}).steering_alphas
    assert alphas == (1.0, -2.0) and all(type(a) is float for a in alphas)
    assert InterventionsConfig.from_dict({"circuit_sizes": [3, 1]}).circuit_sizes == [3, 1]
    config = {"seed": 7, "device": "cpu", "embedded": {"architecture": {"active_heads": [1, 1]}}}
    emb = EmbeddedModelConfig.from_config(config)
    assert emb.architecture.active_heads == (1, 1)
    # The master seed goes to the section and to the nested dataclass that declares it.
    assert (emb.seed, emb.language.seed, emb.device) == (7, 7, "cpu")
    with pytest.raises(TypeError, match="no field 'devcie'"):  # a caller's typo is no default
        SAETrainConfig.from_dict({}, devcie="cpu")


@pytest.mark.parametrize(
    "values, key, line",
    [
        ({"bandwdth": 1}, "sae.jumprelu", "unknown key sae.jumprelu.bandwdth; allowed keys: "
         "bandwidth, dead_window_steps, init_threshold, pre_act_loss_coefficient, "
         "sparsity_loss_mode, ste_to_input, tanh_scale"),
        ({"jumprelu": {"bandwdth": 1}}, "sae", "unknown key sae.jumprelu.bandwdth; allowed keys: "
         "bandwidth, dead_window_steps, init_threshold, pre_act_loss_coefficient, "
         "sparsity_loss_mode, ste_to_input, tanh_scale"),
        ({"foo": 1}, "attribution", "unknown key attribution.foo; allowed keys: batch_size, "),
        ({"ig_steps": 0}, "attribution", "attribution.ig_steps: 0 is less than the minimum of 1"),
        ({"language": {"n_subjects": "many"}}, "embedded",
         "embedded.language.n_subjects: 'many' is not of type integer"),
        ({"n_prompts": 3}, "behaviours.mine", "behaviours.mine: 'source' is a required property"),
    ],
)  # fmt: skip
def test_typed_refuses_in_the_schemas_words_naming_the_full_key(values, key, line):
    """A section given by hand (a test, a benchmark, a JSON config to a stage script) is checked
    against the schema: one line, the full key, the wording config validation uses."""
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.model.embedded import EmbeddedModelConfig
    from circuitflow.prompts import BehaviourConfig
    from circuitflow.sae.config import JumpReLUConfig, SAETrainConfig

    cls = {"sae": SAETrainConfig, "sae.jumprelu": JumpReLUConfig,
           "attribution": AttributionConfig, "embedded": EmbeddedModelConfig,
           "behaviours.mine": BehaviourConfig}[key]  # fmt: skip
    with pytest.raises(cf.ConfigError) as info:
        cf.typed(cls, values, key)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
    # The same line as validating a whole config that holds the section.
    whole = values
    for part in reversed(key.split(".")):
        whole = {part: whole}
    with pytest.raises(cf.ConfigError) as whole_info:
        cf.validate_schema(whole)
    assert str(whole_info.value) == str(info.value)


def test_schema_is_read_once_and_callers_get_their_own_copy():
    from circuitflow import schema

    before = cf.schema_defaults("attribution")
    mine = cf.load_schema()
    mine["properties"]["attribution"]["properties"]["method"]["default"] = "atp"
    assert cf.schema_defaults("attribution") == before
    assert schema._schema.cache_info().currsize >= 1
    hits = schema._schema.cache_info().hits
    cf.schema_defaults("sae")
    assert schema._schema.cache_info().hits > hits


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
