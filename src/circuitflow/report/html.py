"""The report's HTML kit: self-contained pages (the report shows HTML inline, so each page
carries its own style), plain tables and notes. Every page of `report/pages/` is built from
these; the pages know what to show, this module how it looks."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; font-size: 14px;
       margin: 1em 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f3f7; } td.text, th.text { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
.note { color: #555; max-width: 60em; } .ok { color: #1a7f37; } .bad { color: #cf222e; }
pre { background: #f6f8fa; padding: 0.6em; max-height: 30em; overflow: auto; font-size: 12px; }
"""


def cell(value: Any) -> str:
    """A table cell's text: empty for a missing value, 4 significant digits for a float, a list
    joined by commas."""
    if value is None or (not isinstance(value, (list, tuple, dict)) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _cell_html(value: Any, link: bool) -> str:
    """A cell as HTML: its text escaped, or for a link column an anchor to the address."""
    text = html.escape(cell(value))
    return f'<a href="{text}" target="_blank">{text}</a>' if link and text else text


def table_html(frame: pd.DataFrame, max_rows: int | None = None, links=()) -> str:
    """A plain HTML table (numbers right-aligned, 4 significant digits); the columns `links`
    hold addresses, each drawn as a link (empty where null)."""
    if max_rows is not None:
        frame = frame.head(max_rows)
    numeric = {c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}
    head = "".join(
        f'<th class="{"" if c in numeric else "text"}">{html.escape(str(c))}</th>'
        for c in frame.columns
    )
    rows = []
    for row in frame.itertuples(index=False):
        cells = "".join(
            f'<td class="{"" if c in numeric else "text"}">{_cell_html(v, c in links)}</td>'
            for c, v in zip(frame.columns, row, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def kv_table(items: list[tuple[str, Any]]) -> str:
    """A two-column table of (item, value) pairs."""
    frame = pd.DataFrame([(k, cell(v)) for k, v in items], columns=["item", "value"])
    return table_html(frame)


def page(title: str, sections: list[tuple[str, str]], intro: str = "") -> str:
    """A self-contained HTML page: `sections` are (heading, HTML body) pairs."""
    body = "".join(f"<h2>{html.escape(h)}</h2>\n{b}\n" for h, b in sections)
    intro_html = f'<p class="note">{intro}</p>' if intro else ""
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{intro_html}\n"
        f"{body}</body></html>\n"
    )


def note(text: str) -> str:
    return f'<p class="note">{text}</p>'
