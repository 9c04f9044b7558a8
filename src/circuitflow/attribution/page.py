"""graph.html: the attribution graph as a self-contained page (no network access needed)."""

from __future__ import annotations

import html
import json
from typing import Any

KIND_COLOURS = {
    "embedding": "#6a3d9a",
    "head": "#1f78b4",
    "mlp": "#33a02c",
    "feature": "#ff7f00",
    "error": "#999999",
    "logit": "#e31a1c",
}


def graph_html(graph: dict[str, Any], title: str) -> str:
    """A self-contained page: inline SVG, nodes placed by layer (x) and kind (y), hover titles,
    edge width by |weight|, colour by sign. No scripts from elsewhere, no external URLs."""
    nodes = graph["nodes"]
    cols: dict[float, list[dict]] = {}
    for n in nodes:
        x_key = n["layer"] + {"embedding": 0.0, "head": 0.3, "mlp": 0.6}.get(n["kind"], 0.9)
        if n["kind"] == "logit":
            x_key = n["layer"]
        cols.setdefault(x_key, []).append(n)
    xs = sorted(cols)
    width, height = max(600, 140 * len(xs)), max(300, 60 * max(len(v) for v in cols.values()) + 60)
    pos = {}
    for ci, xk in enumerate(xs):
        col = sorted(cols[xk], key=lambda n: -abs(n["score"]))
        for ri, n in enumerate(col):
            pos[n["id"]] = (70 + ci * (width - 140) / max(len(xs) - 1, 1), 40 + ri * 60)
    wmax = max([abs(e["weight"]) for e in graph["edges"]] + [1e-9])
    smax = max([abs(n["score"]) for n in nodes] + [1e-9])
    parts = []
    for e in graph["edges"]:
        if e["source"] not in pos or e["target"] not in pos:
            continue
        (x1, y1), (x2, y2) = pos[e["source"]], pos[e["target"]]
        colour = "#2166ac" if e["weight"] > 0 else "#b2182b"
        w = 0.5 + 6 * abs(e["weight"]) / wmax
        parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            f'stroke-width="{w:.2f}" stroke-opacity="0.6"><title>'
            f"{html.escape(e['source'])} -> {html.escape(e['target'])}: {e['weight']:.4g}"
            "</title></line>"
        )
    for n in nodes:
        x, y = pos[n["id"]]
        r = 5 + 14 * abs(n["score"]) / smax
        parts.append(
            f'<g><circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{KIND_COLOURS[n["kind"]]}">'
            f"<title>{html.escape(n['id'])} ({n['kind']}), score {n['score']:.4g}</title></circle>"
            f'<text x="{x + r + 3:.1f}" y="{y + 4:.1f}" font-size="11">'
            f"{html.escape(n['id'])}</text></g>"
        )
    legend = " ".join(
        f'<span style="color:{c}">&#9679; {k}</span>' for k, c in KIND_COLOURS.items()
    )
    val = graph.get("validation", {})
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head>"
        "<body style='font-family:sans-serif'>"
        f"<h2>{html.escape(title)}</h2><p>{legend}</p>"
        f"<p>method {html.escape(str(graph.get('method')))}; validation spearman "
        f"{val.get('spearman')} (passed: {val.get('passed')}); blue edges help, red hurt.</p>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        + "".join(parts)
        + "</svg>"
        f"<script type='application/json' id='graph'>{html.escape(json.dumps(graph))}</script>"
        "</body></html>\n"
    )
