"""The report's captions (workflow/report/*.rst) render without docutils errors.

`snakemake --report` renders each caption as Snakemake 9 does it (snakemake/report/__init__.py):
Jinja first (trim_blocks, lstrip_blocks; `snakemake` with the job's wildcards and the config,
workflow.rst with the config alone), its link targets appended, then docutils'
`publish_parts(..., writer_name="html")`. docutils does not raise on bad markup: it prints
the problem and puts a "Docutils System Messages" box into the caption (as `|score|`, read as
an undefined substitution, did). Here every caption is rendered the same way, with a strict
Jinja (a misspelt variable fails instead of rendering empty) and the wildcards of the outputs
it captions, and any system message of level WARNING or above fails.
"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import jinja2
import pytest
import yaml
from docutils.core import publish_parts
from helpers.dag import REPO

CAPTIONS = REPO / "workflow" / "report"
RULES = sorted((REPO / "workflow" / "rules").glob("*.smk"))
# An example value per wildcard of the report's outputs.
EXAMPLES = {"behaviour": "induction", "site": "resid_post", "layer": "0"}
# Snakemake's own link targets, appended to every caption before rendering (no results here).
RST_LINKS = """

.. _Workflow: javascript:show_panel('workflow')
.. _Statistics: javascript:show_panel('statistics')
{% for cat, catresults in categories|dictsort %}
.. _{{ cat.name }}: javascript:app.showCategory('{{ cat.name|urlencode }}')
{% endfor %}
{% for res in files %}
.. _{{ res.target }}: javascript:app.showResultInfo('{{ res.path|urlencode }}')
{% endfor %}
"""


def caption_wildcards() -> dict[str, set[str]]:
    """caption file -> the wildcards of the output(s) it captions, from the rules' report()."""
    found: dict[str, set[str]] = {}
    named = set()
    for path in RULES:
        text = path.read_text()
        named |= set(re.findall(r'caption="\.\./report/([^"]+)"', text))
        # The output is a string, or a name the rules define (no wildcards: FEATURE_BROWSER).
        for match in re.finditer(
            r'report\(\s*(?:(f?)"([^"]+)"|\w+),\s*caption="\.\./report/([^"]+)"', text
        ):
            fstring, output, caption = match.groups()
            output = output or ""
            names = re.findall(r"\{\{(\w+)\}\}" if fstring else r"\{(\w+)\}", output)
            found.setdefault(caption, set()).update(names)
    assert named == set(found), f"captions not matched to an output: {named - set(found)}"
    return found


def render(name: str, wildcards: set[str] | None) -> tuple[str, str]:
    """(html body, docutils' messages) of caption `name`; wildcards None: workflow.rst."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    if wildcards is None:
        snakemake = SimpleNamespace(config=config)
    else:
        wc = SimpleNamespace(**{w: EXAMPLES[w] for w in wildcards})
        snakemake = SimpleNamespace(wildcards=wc, config=config, rule="rule", params={})
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    source = (CAPTIONS / name).read_text() + RST_LINKS
    text = env.from_string(source).render(snakemake=snakemake, categories={}, files=[])
    messages = io.StringIO()
    settings = {"warning_stream": messages, "report_level": 2, "halt_level": 5}
    body = publish_parts(text, writer_name="html", settings_overrides=settings)["body"]
    return body, messages.getvalue()


WILDCARDS = caption_wildcards()
# Snakemake 9 calls publish_parts(writer_name=...), which docutils 0.22 deprecates: so do we.
pytestmark = pytest.mark.filterwarnings("ignore:Argument .writer_name.:PendingDeprecationWarning")


def test_every_caption_a_rule_names_exists():
    missing = [name for name in WILDCARDS if not (CAPTIONS / name).is_file()]
    assert not missing, f"captions named in workflow/rules but missing: {missing}"
    assert len(WILDCARDS) >= 15


@pytest.mark.parametrize("name", sorted(p.name for p in CAPTIONS.glob("*.rst")))
def test_caption_renders_without_docutils_messages(name):
    if name == "workflow.rst":
        wildcards = None
    else:
        # A caption no rule names yet is rendered with every wildcard the report knows.
        wildcards = WILDCARDS.get(name, set(EXAMPLES))
    body, messages = render(name, wildcards)
    assert not messages, f"{name}: docutils reports\n{messages}"
    assert "system-message" not in body and "problematic" not in body, body
    assert body.strip(), f"{name} renders empty"
