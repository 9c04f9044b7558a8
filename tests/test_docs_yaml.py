"""Every YAML config README.md and docs/*.md show is one the pipeline accepts.

The rule, so a reader can copy any snippet into their config:

- A fenced block marked ```yaml (or ```yml) must parse as YAML. It is a config (or part of
  one) and is checked as `snakemake --configfile snippet.yaml` would read it: a --configfile
  replaces config/config.yaml, so the snippet alone, every key it leaves out at the schema's
  default. It must pass the schema (types, allowed values, no unknown key: Snakemake's
  `validate`, as the Snakefile runs it), its `layers` must parse for its model where the depth
  is known offline, and its values must work together (`config.check_cross_fields`). Files it
  names (prompt files, dictionary directories) and the model are not read: they are the
  reader's.
- A YAML block that is not a config (a Snakemake profile, a CI file, ...) names the file it
  shows in a comment on its first line, `# profiles/csd3/config.yaml`, a file of the
  repository outside config/ and .test/config/: it need only parse.
- A config shown in any other block (```text, no language) would escape these checks: any
  block that is not shell and parses as a mapping with a top-level config key must be marked
  ```yaml.
- An inline code span in the prose that sets a config key, `KEY: VALUE` with KEY a top-level
  key or a dotted path from one (`sites: [mlp_out]`, `sae: {kind: both}`, `sae.kind: both`), is
  that one setting: `{sae: {kind: both}}` must pass the schema. Its other keys are not the
  reader's config, so values that must work together are not checked (`sae.kind: transcoder`
  alone needs `sites: [mlp_out]` beside it). Spans of a nested key alone (`kind: both`) or with
  a placeholder (`<name>`) are prose, not checked.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import pytest
import yaml
from helpers.dag import REPO

from circuitflow import config as cf

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
YAML_LANGS = {"yaml", "yml"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
CONFIG_DIRS = ("config/", ".test/config/")
TOP_LEVEL = set(cf.load_schema()["properties"])


@dataclass(frozen=True)
class Snippet:
    doc: str  # path under the repository
    line: int  # the first line of its text
    lang: str  # the fence's language ("" for none; "inline" for a code span)
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def fenced_blocks(doc: str, lines: list[str]) -> list[Snippet]:
    blocks, lang, start, body = [], None, 0, []
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and lang is None:
            lang, start, body = fence.group(1).lower(), number + 1, []
        elif fence:
            blocks.append(Snippet(doc, start, lang, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def inline_settings(doc: str, lines: list[str]) -> list[Snippet]:
    """Code spans in the prose (code blocks blanked) that set a top-level config key."""
    prose, in_block = [], False
    for line in lines:
        fence = re.match(r"^\s*```", line)
        prose.append("" if fence or in_block else line)
        in_block ^= bool(fence)
    text = "\n".join(prose)
    spans = []
    for match in re.finditer(r"`([^`\n]+)`", text):
        setting = re.match(r"^([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)*: ", match.group(1))
        if setting and setting.group(1) in TOP_LEVEL and "<" not in match.group(1):
            line = text.count("\n", 0, match.start()) + 1
            spans.append(Snippet(doc, line, "inline", match.group(1)))
    return spans


def snippets() -> list[Snippet]:
    out = []
    for path in DOCS:
        doc, lines = str(path.relative_to(REPO)), path.read_text().splitlines()
        out += fenced_blocks(doc, lines) + inline_settings(doc, lines)
    return out


SNIPPETS = snippets()
BLOCKS = [s for s in SNIPPETS if s.lang in YAML_LANGS]
OTHER_BLOCKS = [s for s in SNIPPETS if s.lang not in YAML_LANGS | SHELL_LANGS | {"inline"}]
INLINE = [s for s in SNIPPETS if s.lang == "inline"]


def shown_file(snippet: Snippet) -> str | None:
    """The repository file a YAML block shows, where its first line names one that is not a
    config; None for a config."""
    first = snippet.text.lstrip("\n").splitlines()[0] if snippet.text.strip() else ""
    named = re.match(r"^#\s*([\w./-]+\.ya?ml)\b", first)
    if not named or named.group(1).startswith(CONFIG_DIRS):
        return None
    return named.group(1)


def check_config(config: dict) -> None:
    """The checks a config passes before any job that need neither its files nor its model."""
    from circuitflow.sae.config import resolve_kind

    config = copy.deepcopy(config)
    cf.validate_schema(config)
    config["sae"]["kind"] = resolve_kind(config, cf.is_embedded(config))  # as config.resolve
    if cf.is_embedded(config) or config["model"]["n_layers"]:
        config["layers"] = cf.parse_layers(config["layers"], cf.model_n_layers(config))
    cf.check_cross_fields(config)


def setting(text: str) -> dict:
    """`sae.kind: both` as the config {"sae": {"kind": "both"}}."""
    path, value = text.split(": ", 1)
    config = yaml.safe_load(f"value: {value}")["value"]
    for key in reversed(path.split(".")):
        config = {key: config}
    return config


def test_the_docs_show_the_snippets_this_test_checks():
    """The extraction finds them: a test that checks nothing cannot fail."""
    assert len(BLOCKS) >= 4
    assert any("pretrained" in s.text for s in BLOCKS)
    assert len(INLINE) >= 20
    inline = {s.text for s in INLINE}
    assert {"sites: [mlp_out]", "sae: {kind: both}", "sae.source: pretrained"} <= inline


@pytest.mark.parametrize("snippet", BLOCKS, ids=lambda s: s.id)
def test_yaml_block_parses_and_a_config_validates(snippet: Snippet):
    try:
        data = yaml.safe_load(snippet.text)
    except yaml.YAMLError as err:
        pytest.fail(f"{snippet.id}: not YAML: {' '.join(str(err).split())}")
    if (file := shown_file(snippet)) is not None:
        assert (REPO / file).is_file(), f"{snippet.id}: shows {file}, which does not exist"
        return
    assert isinstance(data, dict), f"{snippet.id}: a config is a mapping, not {type(data)}"
    try:
        check_config(data)
    except cf.ConfigError as err:
        pytest.fail(f"{snippet.id}: config error: {err}")


@pytest.mark.parametrize("snippet", OTHER_BLOCKS, ids=lambda s: s.id)
def test_a_config_in_another_block_is_marked_yaml(snippet: Snippet):
    try:
        data = yaml.safe_load(snippet.text)
    except yaml.YAMLError:
        return
    keys = set(data) & TOP_LEVEL if isinstance(data, dict) else set()
    assert not keys, (
        f"{snippet.id}: a config ({', '.join(sorted(keys))}) fenced as ```{snippet.lang}"
    )


@pytest.mark.parametrize("snippet", INLINE, ids=lambda s: f"{s.id}: {s.text}")
def test_inline_setting_validates(snippet: Snippet):
    try:
        config = setting(snippet.text)
    except yaml.YAMLError as err:
        pytest.fail(f"{snippet.id}: `{snippet.text}` is not YAML: {' '.join(str(err).split())}")
    try:
        cf.validate_schema(config)
    except cf.ConfigError as err:
        pytest.fail(f"{snippet.id}: `{snippet.text}`: config error: {err}")
