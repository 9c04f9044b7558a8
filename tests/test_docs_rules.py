"""The guides' tables of what each rule writes name every rule the workflow defines: README.md's
"What it computes" and docs/outputs.md's "What each rule writes". A rule is named by a code span
in the table's first column; a rule whose name the workflow builds per job
(`name: f"train_sae_stream_{group.name}"`, `pretrained_sae_{group.name}`) by its prefix and a
placeholder (`train_sae_stream_{group}`). `all` writes nothing of its own."""

from __future__ import annotations

import re

import pytest
from helpers.dag import REPO

RULE_FILES = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
TABLES = {"README.md": "## What it computes", "docs/outputs.md": "## What each rule writes"}


def workflow_rules() -> set[str]:
    """Every rule name, a built one as its prefix plus `{}`."""
    names = set()
    for path in RULE_FILES:
        text = path.read_text()
        names |= set(re.findall(r"(?m)^\s*(?:local)?rule (\w+)\s*:", text))
        names |= {f"{p}{{}}" for p in re.findall(r'(?m)^\s*name:\s*f"(\w+?)\{', text)}
    return names - {"all"}


def table_rules(doc: str, heading: str) -> set[str]:
    """The code spans in the first column of the table under `heading`, each `{...}`
    placeholder written `{}`."""
    text = (REPO / doc).read_text()
    section = text[text.index(heading) :].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    firsts = [row.split(" | ")[0] for row in rows[2:]]  # after the header and --- rows
    return {
        re.sub(r"\{[^}]*\}", "{}", span)
        for cell in firsts
        for span in re.findall(r"`([^`]+)`", cell)
    }


def test_the_workflow_has_the_rules_this_test_reads():
    rules = workflow_rules()
    assert {"train_sae", "prefetch_saes", "prompt_graphs"} <= rules
    assert {"train_sae_stream_{}", "pretrained_sae_{}"} <= rules


@pytest.mark.parametrize("doc", sorted(TABLES))
def test_rule_table_names_every_rule(doc):
    missing = workflow_rules() - table_rules(doc, TABLES[doc])
    assert not missing, f"{doc}: {TABLES[doc]!r} names no {', '.join(sorted(missing))}"
