"""The docs' links lead somewhere: every relative link in README.md and docs/*.md names a file
that exists and, with `#anchor`, a heading of that file (GitHub's anchors); docs/outputs.md's
contents list names every one of its sections, so a section added for a new output file is
listed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.dag import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OUTPUTS = REPO / "docs" / "outputs.md"


def _prose(text: str) -> str:
    """The text with fenced code blocks blanked (links and headings there are not markdown)."""
    return re.sub(r"(?ms)^\s*```.*?^\s*```", "", text)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: the heading's text (code spans' backticks dropped) lower-cased,
    everything but letters, digits, `_`, `-` and spaces removed, spaces made `-`; a repeated
    anchor gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"(?m)^#{1,6} +(.+?) *#*$", _prose(path.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[tuple[str, str]]:
    """(target file, anchor) of every relative markdown link in `path`."""
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        out.append((file, anchor))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path):
    found = links(doc)
    for file, anchor in found:
        target = (doc.parent / file).resolve() if file else doc
        assert target.exists(), f"{doc.name}: link to {file} which does not exist"
        if anchor:
            assert target.suffix == ".md", f"{doc.name}: anchor #{anchor} into {file}"
            assert anchor in anchors(target), (
                f"{doc.name}: link to {file}#{anchor}: no such heading in {target.name}"
            )


def test_outputs_contents_lists_every_section():
    text = _prose(OUTPUTS.read_text())
    block = re.search(r"<!-- contents -->\n(.*?)<!-- /contents -->", text, re.S)
    assert block, "docs/outputs.md has no <!-- contents --> list"
    listed = set(re.findall(r"\]\(#([^)]+)\)", block.group(1)))
    sections = anchors(OUTPUTS) - {"outputs", "contents"}
    assert sections - listed == set(), f"sections missing from the contents: {sections - listed}"
    assert listed - sections == set(), f"contents entries without a section: {listed - sections}"
    assert len(listed) >= 40
