"""The dictionary sources' registry (src/circuitflow/dictionary_sources.py): the schema offers
exactly its names, each record's plan, script and entry point exist, an unknown source is
refused in one line, and a source added by its registry line alone (and the schema's enum) is
planned by the rule table, the grouping, the fit check and a Snakemake dry run with no other
edit."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import replace

import pytest
import yaml
from helpers.dag import REPO, SNAKEMAKE

from circuitflow import config as cf_config
from circuitflow import dictionary_sources, fit, resources, stream_groups
from circuitflow.capture import plan as capture_plan
from circuitflow.cluster import Cluster
from circuitflow.errors import ConfigError
from circuitflow.model import architectures
from circuitflow.sae import config as sae_config

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
PUBLISHED = REPO / "config" / "gpt2-small-res-jb.yaml"  # sae.source: pretrained, a release
CSD3 = Cluster(gpu_type="A100", max_runtime=2160, gpu_partition="ampere")


def test_the_schema_offers_exactly_the_registered_sources():
    schema = yaml.safe_load(SCHEMA.read_text())
    enum = schema["properties"]["sae"]["properties"]["source"]["enum"]
    assert enum == list(dictionary_sources.names())


@pytest.mark.parametrize("name", dictionary_sources.names())
def test_each_record_names_a_plan_script_and_entry_point_that_exist(name):
    source = dictionary_sources.named(name)
    plan = importlib.import_module(source.plan)
    assert callable(plan.job_bytes) and callable(plan.job_work)
    if source.grouped:  # what stream_groups splits, and (held at once) sizes by memory
        assert callable(plan.members)
    if source.holds_group:
        assert source.grouped and callable(plan.group_bytes)
    assert resources.rule_of(source.rule).plan is plan
    assert resources.rule_of(source.rule).resumable == source.trains
    # The script calls the entry point, which its module defines.
    module, function = source.entry_point.split(":")
    script = (REPO / "scripts" / f"{source.script}.py").read_text()
    assert f"{module.rsplit('.', 1)[1]}.{function}(" in script, (source.script, function)
    tree = ast.parse(open(importlib.util.find_spec(module).origin).read())
    assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    # Its dictionaries are made from something: activation files or the token set.
    assert source.reads_activation_files or source.needs_token_set
    assert source.kinds and set(source.kinds) <= {"sae", "transcoder", "both"}


KEPT_KEYS = (
    "sae.checkpoint_every_tokens",
    "sae.eval_contexts",
    "sae.stream.batch_contexts",
    "sae.pretrained.path",
    "attribution.ig_steps",
)


def test_the_keys_that_change_a_trained_dictionary():
    """What a resume fingerprint covers: the sae section and the seed; not the checkpoint
    cadence, the evaluation or the other sources' settings."""
    for name in ("capture", "stream"):
        source = dictionary_sources.named(name)
        assert source.changes_dictionaries("sae.lr") and source.changes_dictionaries("seed")
        for kept in KEPT_KEYS:
            assert not source.changes_dictionaries(kept), (name, kept)
    assert dictionary_sources.named("stream").changes_dictionaries("capture.exclude_bos")
    pretrained = dictionary_sources.named("pretrained")
    assert pretrained.changes_dictionaries("sae.pretrained.release")
    assert not pretrained.changes_dictionaries("sae.lr")


def test_an_unknown_source_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(ConfigError) as err:
        dictionary_sources.get({"sae": {"source": "published"}})
    assert str(err.value) == (
        "sae.source: 'published' is not a dictionary source; known: capture, stream, pretrained"
    )
    # The planners ask the record: none plans an unknown source as another.
    config = cf_config.resolve({}, REPO)
    config["sae"]["source"] = "published"
    for plan in (
        lambda: resources.disk_plan(config),
        lambda: resources.mem_mb(config, "capture_tokens"),
        lambda: stream_groups.stream_groups(config),
        lambda: sae_config.check(config, {"d_model": 64}),
    ):
        with pytest.raises(ConfigError, match=r"^sae.source: 'published' is not a dictionary"):
            plan()


# --- a source added by the registry alone ---------------------------------------------------
def published(monkeypatch) -> dict:
    """config/gpt2-small-res-jb.yaml's source registered again as `published` (what a mirror
    of published dictionaries would be), and the config naming it."""
    record = replace(dictionary_sources.named("pretrained"), name="published")
    monkeypatch.setitem(dictionary_sources.SOURCES, "published", record)
    config = cf_config.load(PUBLISHED)
    return {**config, "sae": {**config["sae"], "source": "published"}}


def jobs_of(config: dict, groups) -> list[tuple[str, str | None]]:
    return [
        ("capture_tokens", None),
        ("prefetch_saes", None),
        *(("pretrained_sae", g.key) for g in groups),
        ("attribution", None),
    ]


def test_a_source_added_by_its_registry_line_is_planned_as_its_record_says(monkeypatch):
    """Registered under another name with pretrained's record, the planners plan it as they
    plan pretrained (not as capture, which an unknown name used to fall back to): the same
    groups, memory, walltimes, disk and fit, and the kind checks name it."""
    renamed = published(monkeypatch)
    original = cf_config.load(PUBLISHED)
    assert stream_groups.group_rule(renamed) == "pretrained_sae"
    assert stream_groups.group_members(renamed) == stream_groups.group_members(original)
    groups = stream_groups.stream_groups(renamed, CSD3)
    assert groups == stream_groups.stream_groups(original, CSD3) and len(groups) == 1
    jobs = jobs_of(renamed, groups)
    for rule, job in jobs:
        for attempt in (1, 2):
            assert resources.mem_mb(renamed, rule, attempt, job) == resources.mem_mb(
                original, rule, attempt, job
            ), (rule, job)
            assert resources.runtime(renamed, rule, attempt, CSD3, job) == resources.runtime(
                original, rule, attempt, CSD3, job
            ), (rule, job)
    assert resources.disk_plan(renamed) == resources.disk_plan(original)
    as_capture = {**renamed, "sae": {**renamed["sae"], "source": "capture"}}
    assert (
        resources.disk_plan(as_capture)["activations"]
        > 100 * (resources.disk_plan(renamed)["activations"])
    )
    cfg = architectures.model_cfg(renamed)
    assert capture_plan.token_set_contexts(renamed) == capture_plan.contexts(renamed, cfg)[2]
    # The fit check: nothing refused on the profile, and the same line where memory runs short.
    machine = fit.Machine(memory=2**40, free_disk=2**50)
    assert fit.problem(renamed, jobs, CSD3, machine) is None
    small = Cluster(gpu_type="A100", gpu_partition="ampere", gpu_node_mem_gib=1, stated=True)
    line = fit.problem(original, jobs, small, machine)
    assert line is not None and fit.problem(renamed, jobs, small, machine) == line
    transcoders = {**renamed, "sites": ["mlp_out"], "sae": {**renamed["sae"], "kind": "transcoder"}}
    sae_config.check_transcoders(transcoders)  # published transcoders, as pretrained's
    sae_only = replace(dictionary_sources.named("published"), kinds=("sae",))
    monkeypatch.setitem(dictionary_sources.SOURCES, "published", sae_only)
    with pytest.raises(
        ConfigError,
        match=r"^sae.source: 'published' with sae.kind transcoder; "
        r"published makes sae.kind sae only: use sae.source capture or stream or pretrained$",
    ):
        sae_config.check_transcoders(transcoders)


KEPT = ("input:", "output:", "log:", "benchmark:", "wildcards:", "resources:")


def dry_run_jobs(root, configfile) -> list[tuple[str, ...]]:
    """Each job of a dry run of the workflow at `root`: its rule line and its inputs, outputs,
    wildcards and resources, in a stable order (job ids and dates left out)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root / "src")}
    cmd = [*SNAKEMAKE, "-n", "--forceall", "--configfile", str(configfile)]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    jobs: list[list[str]] = []
    for line in done.stdout.splitlines():
        if re.match(r"^(local)?rule \S+:$", line):
            jobs.append([line])
        elif jobs and line.strip().startswith(KEPT):
            jobs[-1].append(line.strip())
    return sorted(tuple(job) for job in jobs)


def test_the_workflow_runs_a_source_added_by_its_registry_line_and_enum(tmp_path):
    """A copy of the workflow with one registry line (pretrained's record named `published`)
    and the schema's enum edited, nothing else: its dry run declares the same jobs with the
    same resources for `sae.source: published` as for pretrained."""
    root = tmp_path / "repo"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("Snakefile", "workflow", "src", "config", "profiles", "envs", "scripts"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=ignore)
        else:
            shutil.copy(src, root / name)
    registry = root / "src" / "circuitflow" / "dictionary_sources.py"
    line = 'register(dataclasses.replace(SOURCES["pretrained"], name="published"))'
    registry.write_text(f"{registry.read_text()}\nimport dataclasses  # noqa: E402\n\n{line}\n")
    schema = root / "workflow" / "schemas" / "config.schema.yaml"
    text = schema.read_text()
    enum = "enum: [capture, stream, pretrained]"
    assert text.count(enum) == 1
    schema.write_text(text.replace(enum, "enum: [capture, stream, pretrained, published]"))
    config = yaml.safe_load(PUBLISHED.read_text())
    config["outdir"] = str(tmp_path / "results")
    runs = {}
    for name in ("pretrained", "published"):
        config["sae"]["source"] = name
        configfile = tmp_path / f"{name}.yaml"
        configfile.write_text(yaml.safe_dump(config))
        runs[name] = dry_run_jobs(root, configfile)
    rules = [job[0] for job in runs["published"]]
    assert "rule prefetch_saes:" in rules and "rule capture_tokens:" in rules
    assert any(rule.startswith("rule pretrained_sae_resid_pre_layer_") for rule in rules)
    assert not any(rule.startswith(("rule train_sae", "rule capture:")) for rule in rules)
    assert len(runs["published"]) > 20 and runs["published"] == runs["pretrained"]


def test_saes_and_transcoders_from_different_sources_are_planned_as_their_parts():
    """sae.kind both with sae.transcoders.source apart: each source's part of the run is a run of
    its own dictionaries (its sites, sae.kind, sae.source), which its rules, groups and plans
    read; the token set is sized for the source that trains on it; capture writes the
    capturing part's sites alone."""
    from circuitflow.sites import capture_sites

    config = cf_config.resolve({"sae": {"kind": "both", "source": "pretrained",
                                        "pretrained": {"release": "circuitflow-test/saes",
                                                       "sae_id": "{site}/layer_{layer}"},
                                        "transcoders": {"source": "stream"}}}, REPO)  # fmt: skip
    pretrained, stream = (dictionary_sources.named(n) for n in ("pretrained", "stream"))
    assert dictionary_sources.used(config) == [pretrained, stream]
    saes, tcs = (dictionary_sources.part(config, s) for s in (pretrained, stream))
    assert (saes["sites"], saes["sae"]["kind"], saes["sae"]["source"]) == (
        ["resid_post"],
        "sae",
        "pretrained",
    )
    assert (tcs["sites"], tcs["sae"]["kind"], tcs["sae"]["source"]) == (
        ["mlp_out"],
        "transcoder",
        "stream",
    )
    assert [g.members for g in stream_groups.stream_groups(tcs)] == [
        (("mlp_out", 0),),
        (("mlp_out", 1),),
    ]
    assert dictionary_sources.part_of_rule(config, "train_sae_stream") == tcs
    assert dictionary_sources.token_set_source(config) == stream  # sae.total_tokens
    assert not dictionary_sources.run_reads_activation_files(config)
    captured = {**config, "sae": {**config["sae"], "source": "capture",
                                  "transcoders": {**config["sae"]["transcoders"],
                                                  "source": "pretrained"}}}  # fmt: skip
    assert capture_sites(dictionary_sources.capture_part(captured)) == ["resid_post"]
    assert dictionary_sources.token_set_source(captured).name == "capture"
