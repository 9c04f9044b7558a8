"""docs/csd3.md against the pipeline: its walltime table is the CSD3 dry run's, and it names
every GPU rule and every login-node download (issue 40)."""

from __future__ import annotations

import re

import pytest
from helpers.dag import REPO
from helpers.walltimes import walltime_table

from circuitflow import resources

pytestmark = pytest.mark.slow
GUIDE = REPO / "docs" / "csd3.md"


def block(name: str) -> str:
    match = re.search(rf"<!-- {name} -->\n(.*?)\n<!-- /{name} -->", GUIDE.read_text(), re.S)
    assert match, f"docs/csd3.md has no <!-- {name} --> block"
    return match.group(1).strip()


def test_walltime_table_is_the_dry_runs():
    want = walltime_table()
    assert block("walltimes") == want, f"docs/csd3.md's walltimes block should read:\n{want}"


def test_guide_names_every_gpu_rule_and_download():
    text = GUIDE.read_text()
    for rule in sorted(resources.GPU_RULES):
        assert re.search(rf"\b{rule}", text), rule
    for rule in (r for r in resources.RULES if r.startswith("prefetch_")):
        assert f"`{rule}`" in text, rule
