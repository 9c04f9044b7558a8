"""The feature browser: a self-contained page per dictionary (no network access needed) and an
index of them all.

Input: for each dictionary (site, layer), its folder `features/{site}/layer_{layer}/` as
`features/write.py` writes it (`features.parquet`, `contexts.parquet`, `summary.json`; that
module's docstring is the contract).

- A dictionary's page, `report/features/{site}/layer_{layer}.html` (nodes.dictionary_page,
  relative to the index's folder; rule report_features_dictionary, one job per dictionary):
  Python reads its folder and embeds what the page shows as JSON: per feature its index, label,
  density, maximum and mean activation, activation histogram (sparse: the bins with tokens),
  promoted and suppressed tokens with their logit effects, and its contexts (the first `n_top`
  top contexts and `n_per_band` quantile samples of each band, each a window of token ids with
  every token's activation, rounded to 4 significant digits); token strings are stored once
  per page (`vocab`: token id -> string). A token costs about 10 bytes of the page, a feature
  with the defaults (10 top and 10 quantile contexts of 17 tokens) about 3 kB (3.1 kB measured
  on the embedded language): 1.6 MB for a 512-feature dictionary of the embedded default, some
  75 MB for one of GPT-2 small's 24,576-feature SAEs (lower `n_top` and `n_per_band` there).
  `features_page.js` (plain JavaScript, inlined) draws the table (sortable by index, density,
  maximum and mean activation; searchable by index, label and token) and a feature's card
  (histogram, highlighted contexts, logit table); `features_page.css` styles it. A feature's
  card has the anchor `Node.anchor` (`#resid_post.1.f355`, circuitflow.nodes): a graph page
  links a feature node to `Node.card` (`features/resid_post/layer_1.html#resid_post.1.f355`)
  from the index's folder.
- The index, `report/features.html` (nodes.BROWSER_INDEX; rule report_features): one row per
  dictionary (site, layer, kind, features, dead and dense fractions and tokens read, from its
  summary.json) linking to its page. An address `features.html#resid_post.1.f355` (the single
  page's before the browser was split) goes on to that feature's card on its dictionary's page.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from circuitflow.errors import InputError
from circuitflow.features.read import shown
from circuitflow.io import json_text, write_text
from circuitflow.nodes import BROWSER_INDEX, dictionary_anchor, dictionary_page, neuronpedia_pages

__all__ = [
    "N_PER_BAND",
    "N_TOP",
    "dictionary_data",
    "index_html",
    "index_rows",
    "page_html",
    "site_layer_of",
    "write_dictionary_page",
    "write_index",
]

N_TOP = 10  # top contexts shown per feature
N_PER_BAND = 2  # quantile-sampled contexts shown per band
DIGITS = 4  # significant digits of the activations on the page
FILES = ("features.parquet", "contexts.parquet", "summary.json")
# summary.json keys the page shows in their own words; any other scalar key (the stage's
# `meta`: hook, dictionary kind, which tokens were read) is listed as it is.
SHOWN = {
    "n_features", "n_tokens", "n_contexts", "context_length", "first_position", "k", "samples",
    "seed", "hist_edges", "quantile_bands", "dense_threshold", "log_density_edges",
    "log_density_hist", "dead", "dense", "dead_fraction", "dense_fraction", "labeller", "window",
    "final_norm", "site", "layer", "neuronpedia_id", "labels",
}  # fmt: skip


def significant(values: np.ndarray, digits: int = DIGITS) -> np.ndarray:
    """`values` rounded to `digits` significant digits (float64, so JSON prints them short)."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(v))))
        out = np.round(v * scale) / scale
    return np.where(np.isfinite(out), out, v)


def _read(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise InputError(f"{folder}: missing {', '.join(missing)} (the features stage's files)")
    try:
        feats = pd.read_parquet(folder / "features.parquet").sort_values("feature")
        ctx = pd.read_parquet(folder / "contexts.parquet")
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{folder}: cannot read the features stage's files: {e}") from e
    return feats.reset_index(drop=True), ctx, summary


def _kept_contexts(ctx: pd.DataFrame, n_top: int, n_per_band: int) -> pd.DataFrame:
    """The contexts the page shows: top ones by rank, then each band's samples, band by band."""
    keep = ((ctx["kind"] == "top") & (ctx["rank"] < n_top)) | (
        (ctx["kind"] == "quantile") & (ctx["rank"] < n_per_band)
    )
    return ctx[keep].sort_values(["feature", "band", "rank"]).reset_index(drop=True)


def _windows(ctx: pd.DataFrame) -> list[list[float]]:
    """Each context's per-token activations, rounded once over all contexts."""
    lengths = ctx["values"].map(len).to_numpy()
    flat = significant(np.concatenate([*ctx["values"].to_numpy(), np.empty(0)]))
    return [part.tolist() for part in np.split(flat, np.cumsum(lengths)[:-1])] if len(ctx) else []


def dictionary_data(
    site: str,
    layer: int,
    folder: Path | str,
    vocab: dict[int, str],
    n_top: int = N_TOP,
    n_per_band: int = N_PER_BAND,
) -> dict[str, Any]:
    """What features_page.js reads of one dictionary; adds the token strings it uses to `vocab`."""
    feats, ctx, summary = _read(Path(folder))
    ctx = _kept_contexts(ctx, n_top, n_per_band)
    for ids, strs in zip(feats["promoted_ids"], feats["promoted_str"], strict=True):
        vocab.update(zip(map(int, ids), strs, strict=True))
    for ids, strs in zip(feats["suppressed_ids"], feats["suppressed_str"], strict=True):
        vocab.update(zip(map(int, ids), strs, strict=True))
    for ids, strs in zip(ctx["tokens"], ctx["token_str"], strict=True):
        vocab.update(zip(map(int, ids), strs, strict=True))
    contexts: dict[int, list] = {}
    bands: dict[int, dict[int, list]] = {}
    values = _windows(ctx)
    for r, vals in zip(ctx.itertuples(index=False), values, strict=True):
        f, band = int(r.feature), int(r.band)
        contexts.setdefault(f, []).append(
            [band, float(significant(r.activation)), int(r.qualifying_index),
             [int(t) for t in r.tokens], vals]
        )  # fmt: skip
        if band >= 0:
            bands.setdefault(f, {})[band] = [
                float(significant(r.band_lo)), float(significant(r.band_hi)),
                float(significant(r.band_share)),
            ]  # fmt: skip

    def sparse_hist(h) -> list[list[int]]:
        h = np.asarray(h)
        return [[int(i), int(h[i])] for i in np.flatnonzero(h)]

    def logit_rows(ids, vals) -> list[list]:
        return [[int(i), float(v)] for i, v in zip(ids, significant(vals), strict=True)]

    edges = summary["hist_edges"]
    meta = {k: v for k, v in summary.items() if k not in SHOWN and isinstance(v, str | int | float)}
    scores = label_scores(feats)
    return {
        "key": dictionary_anchor(site, layer),
        "site": site,
        "layer": int(layer),
        # A published dictionary's features' pages: the id, then the feature's index.
        "neuronpedia": neuronpedia_pages(summary.get("neuronpedia_id")),
        "summary": {k: summary.get(k) for k in sorted(SHOWN - {"hist_edges", "dead", "dense"})}
        | {"n_dead": len(summary.get("dead", [])), "n_dense": len(summary.get("dense", []))},
        "meta": meta,
        "hist_edges": [float("inf") if e is None else e for e in edges],
        "features": {
            "feature": feats["feature"].astype(int).tolist(),
            "label": [
                shown(label, f1)
                for label, f1 in zip(feats["label"].astype(str), scores["f1"], strict=True)
            ],
            **{name: _nullable(values) for name, values in scores.items()},
            "count": feats["count"].astype(int).tolist(),
            "density": significant(feats["density"]).tolist(),
            "max": significant(feats["max_activation"]).tolist(),
            "mean": significant(feats["mean_activation"]).tolist(),
            "dead": feats["dead"].astype(bool).tolist(),
            "dense": feats["dense"].astype(bool).tolist(),
            "hist": [sparse_hist(h) for h in feats["hist"]],
            "promoted": [
                logit_rows(i, v)
                for i, v in zip(feats["promoted_ids"], feats["promoted_values"], strict=True)
            ],
            "suppressed": [
                logit_rows(i, v)
                for i, v in zip(feats["suppressed_ids"], feats["suppressed_values"], strict=True)
            ],
            "contexts": [contexts.get(int(f), []) for f in feats["feature"]],
            "bands": [
                {str(b): v for b, v in bands.get(int(f), {}).items()} for f in feats["feature"]
            ],
        },
    }


# A label's held-out score on the card: its F1, precision and recall, the counts behind them
# and its control (features.parquet's label_* columns; NaN where unscored, absent in a folder
# written before labels were scored).
SCORE_COLUMNS = {
    "f1": "label_f1", "precision": "label_precision", "recall": "label_recall",
    "tp": "label_tp", "fp": "label_fp", "fn": "label_fn", "control_f1": "label_control_f1",
}  # fmt: skip


def label_scores(feats: pd.DataFrame) -> dict[str, np.ndarray]:
    """The label score columns the page shows, by their short names (NaN where missing)."""
    nan = np.full(len(feats), np.nan)
    return {
        short: feats[col].to_numpy(dtype=np.float64) if col in feats else nan
        for short, col in SCORE_COLUMNS.items()
    }


def _nullable(values: np.ndarray) -> list[float | None]:
    """Rounded for the page, NaN as null."""
    rounded = significant(values)
    return [None if np.isnan(v) else float(v) for v in rounded]


def _asset(name: str) -> str:
    return resources.files("circuitflow.report").joinpath(name).read_text()


def _json_for_script(data: dict[str, Any]) -> str:
    """JSON safe inside <script>: no `</script>` or `<!--` can end or change the element."""
    return json_text(data).replace("<", "\\u003c")


CONTROLS = """
<div id="summary"></div>
<div id="controls">
  <label>search <select id="search-mode">
    <option value="any">index, label or token</option><option value="index">index</option>
    <option value="label">label</option><option value="token">token</option>
  </select> <input type="search" id="search" placeholder="e.g. 355, fires on, Paris"></label>
  <label>sort by <select id="sort">
    <option value="feature">index</option><option value="f1">label F1</option>
    <option value="density">density</option>
    <option value="max">max activation</option><option value="mean">mean activation</option>
  </select></label>
  <label><input type="checkbox" id="descending"> descending</label>
  <span id="counts"></span>
</div>
<p class="help">A label says where its feature fires; its F1 (held-out tokens no dictionary
was trained on and no label was written from) says how well: at 0.8 or more the label predicts
the feature well, below 0.5 it is marked weak (docs/reading-results.md). A token search matches
a token the feature fires on in its top contexts or one it promotes (whole tokens, ignoring case
and surrounding spaces); a label search any part of the label. Click a row (or a column title
to sort by it) to open the feature's card; its address
(<code>#site.layer.fINDEX</code>) opens that card directly. In the contexts each token is shaded
by the feature's activation on it relative to the feature's maximum; the boxed token is the one
the context was kept for.</p>
"""


def _page(title: str, body: str, script: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_asset('features_page.css')}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}<script>{script}</script></body></html>\n"
    )


def index_href(site: str, layer: int) -> str:
    """The index seen from the dictionary's page (`../../features.html`)."""
    return "../" * dictionary_page(site, layer).count("/") + BROWSER_INDEX


def page_html(dictionary: dict[str, Any], vocab: dict[int, str], title: str | None = None) -> str:
    """A dictionary's page: title, summary, controls, the table and the card, drawn by
    features_page.js from the data (dictionary_data, and the vocab it filled)."""
    data = {"dictionary": dictionary, "vocab": vocab,
            "index": index_href(dictionary["site"], dictionary["layer"])}  # fmt: skip
    title = title or f"Features of {dictionary['site']} layer {dictionary['layer']}"
    body = (
        f"{CONTROLS}"
        '<div id="browser"><div id="table-scroll"><table id="features"><thead></thead>'
        '<tbody></tbody></table><button id="more" hidden>show more</button></div>'
        '<div id="card" hidden></div></div>'
        f'<script type="application/json" id="feature-data">{_json_for_script(data)}</script>'
    )
    return _page(title, body, _asset("features_page.js"))


def write_dictionary_page(
    folder: Path | str, out_html: Path | str, n_top: int = N_TOP, n_per_band: int = N_PER_BAND
) -> Path:
    """Write the page of the dictionary whose folder is `folder` (`features/{site}/layer_{layer}`)
    to `out_html` (report/ + nodes.dictionary_page: its link to the index assumes it),
    atomically."""
    site, layer = site_layer_of(folder)
    vocab: dict[int, str] = {}
    data = dictionary_data(site, layer, folder, vocab, n_top, n_per_band)
    write_text(out_html, page_html(data, dict(sorted(vocab.items()))))
    return Path(out_html)


def site_layer_of(folder: Path | str) -> tuple[str, int]:
    """(site, layer) of a folder `features/{site}/layer_{layer}` (features.write.feature_dir)."""
    folder = Path(folder)
    name, site = folder.name, folder.parent.name
    if not name.startswith("layer_") or not name[6:].isdigit() or not site:
        raise InputError(f"{folder}: not a features/{{site}}/layer_{{layer}} directory")
    return site, int(name[6:])


def _summary(folder: Path) -> dict[str, Any]:
    path = folder / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the features stage's summary: {e}") from e
    missing = [k for k in INDEX_KEYS if k not in summary]
    if missing:
        raise InputError(f"{path}: missing {', '.join(missing)}")
    return summary


INDEX_KEYS = ("n_features", "n_tokens", "dead_fraction", "dense_fraction")


def index_rows(folders: list[Path | str]) -> pd.DataFrame:
    """One row per dictionary, in forward-pass order of (layer, site): its site, layer, kind,
    features, dead and dense fractions and tokens read (summary.json) and its page."""
    rows, seen = [], set()
    for folder in map(Path, folders):
        site, layer = site_layer_of(folder)
        if (site, layer) in seen:
            raise InputError(f"{folder}: {site} layer {layer} given twice")
        seen.add((site, layer))
        s = _summary(folder)
        rows.append({
            "dictionary": dictionary_anchor(site, layer), "site": site, "layer": layer,
            "kind": s.get("dictionary_kind") or s.get("dictionary") or "n/a",
            "n_features": int(s["n_features"]), "dead_fraction": s["dead_fraction"],
            "dense_fraction": s["dense_fraction"], "n_tokens": int(s["n_tokens"]),
            **_label_summary(s), "page": dictionary_page(site, layer),
        })  # fmt: skip
    if not rows:
        raise InputError("feature browser: no feature directories given")
    return pd.DataFrame(rows).sort_values(["layer", "site"], ignore_index=True)


def _label_summary(summary: dict) -> dict[str, Any]:
    """The shown labeller, its held-out mean F1 and share at F1 >= 0.8 and its control's mean F1
    (summary.json's `labels`; None where the folder has none)."""
    labels = summary.get("labels") or {}
    block = (labels.get("labellers") or {}).get(labels.get("shown"), {})
    return {
        "labeller": labels.get("shown") or summary.get("labeller") or "n/a",
        "label_mean_f1": block.get("mean_f1"),
        "label_strong": block.get("share_f1_at_least_0.8"),
        "label_control_f1": (block.get("control") or {}).get("mean_f1"),
    }


def _missing(x: float | None) -> bool:
    return x is None or x != x  # None, or NaN (pandas' missing number)


def _number(x: float | None) -> str:
    return "n/a" if _missing(x) else f"{x:.3g}"


def _percent(x: float | None) -> str:
    return "n/a" if _missing(x) else f"{100 * float(f'{x:.3g}'):.3g}%"


# Sends an old single-page address (`features.html#resid_post.1.f355`) on to its page.
REDIRECT_JS = """(function () {
  const pages = JSON.parse(document.getElementById("pages").textContent);
  let target = location.hash.slice(1);
  try { target = decodeURIComponent(target); } catch (e) { /* match it as it is */ }
  const m = /^(.*?)(\\.f\\d+)?$/.exec(target);
  if (target && pages[m[1]]) location.replace(pages[m[1]] + "#" + target);
})();"""


def index_html(rows: pd.DataFrame, title: str = "Feature browser") -> str:
    """The index: a row per dictionary (index_rows) linking to its page."""
    head = ("<tr><th>dictionary</th><th>kind</th><th>features</th><th>dead</th><th>dense</th>"
            "<th>tokens read</th><th>labels</th><th>label F1 (mean)</th><th>F1 &ge; 0.8</th>"
            "<th>control F1</th></tr>")  # fmt: skip
    body = "".join(
        f'<tr id="{html.escape(r.dictionary)}" data-dictionary="{html.escape(r.dictionary)}">'
        f'<td><a href="{html.escape(r.page)}">{html.escape(r.site)} layer {r.layer}</a></td>'
        f"<td>{html.escape(r.kind)}</td><td class='num'>{r.n_features}</td>"
        f"<td class='num'>{_percent(r.dead_fraction)}</td>"
        f"<td class='num'>{_percent(r.dense_fraction)}</td>"
        f"<td class='num'>{r.n_tokens}</td><td>{html.escape(r.labeller)}</td>"
        f"<td class='num'>{_number(r.label_mean_f1)}</td>"
        f"<td class='num'>{_percent(r.label_strong)}</td>"
        f"<td class='num'>{_number(r.label_control_f1)}</td></tr>"
        for r in rows.itertuples()
    )
    intro = (
        '<p class="help">One page per dictionary the run has, each with its features\' table '
        "(sortable by density and activation, searchable by index, label and token) and cards "
        "(activation histogram, highlighted contexts, logit effects). dead: features that never "
        "fired on the tokens the features stage read; dense: those that fired on more than its "
        "features.dense_threshold of them. labels: the labeller each dictionary shows, its "
        "labels' held-out mean F1 at predicting where their features fire, the share of "
        "features whose label reaches F1 0.8, and the same mean F1 for labels permuted across "
        "features (the control: what no relation scores). A graph page's click on a feature "
        "opens its card "
        "(<code>features/{site}/layer_{layer}.html#site.layer.fINDEX</code>).</p>"
    )
    pages = {r.dictionary: r.page for r in rows.itertuples()}
    table = f'<table class="dictionaries"><thead>{head}</thead><tbody>{body}</tbody></table>'
    data = f'<script type="application/json" id="pages">{_json_for_script(pages)}</script>'
    return _page(title, intro + table + data, REDIRECT_JS)


def write_index(folders: list[Path | str], out_html: Path | str) -> Path:
    """Write the index of the dictionaries whose folders are `folders` (each named once) to
    `out_html` (report/features.html; the pages beside it in features/), atomically."""
    write_text(out_html, index_html(index_rows(folders)))
    return Path(out_html)
