"""Figures of the attribution stage: head heatmap and top features per layer."""

from __future__ import annotations

import numpy as np
import pandas as pd

from circuitflow.nodes import Node
from circuitflow.plots import layer_head_grid, pyplot

LABEL_CHARS = 48  # a feature's label on the figure is cut here ("…")


def head_heatmap(heads: pd.DataFrame, n_layers: int, n_heads: int, title: str):
    """Layer x head grid of head scores, diverging colours centred on zero."""
    grid = np.zeros((n_layers, n_heads))
    for r in heads.itertuples():
        grid[int(r.layer), int(r.head)] = r.score
    return layer_head_grid(
        grid, lambda i, j: f"{grid[i, j]:.2g}", "RdBu", "effect on logit difference", title
    )


def feature_tick(site: str, layer: int, feature: int, labels: dict | None) -> str:
    """A feature's name on the figure, `resid_post.1.f355 — label` (its anchor in the feature
    browser and its label, features.read.read_labels' `labels`; the name alone without one),
    or `error` for the SAE's error term (feature -1)."""
    if feature < 0:
        return "error"
    name = Node("feature", layer, feature, site).anchor
    label = (labels or {}).get((site, layer), {}).get(feature)
    if not label:
        return name
    cut = label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"
    return f"{name} — {cut}"


def top_features(features: pd.DataFrame, top: int, title: str, labels: dict | None = None):
    """One panel per (site, layer): the `top` features by |score|, error term included, each
    named by its anchor and its label from `labels` ((site, layer) -> feature -> label, as
    features.read.read_labels reads the features stage's folders)."""
    plt = pyplot()
    keys = sorted({(r.site, int(r.layer)) for r in features.itertuples()}, key=lambda k: k[1])
    n = max(len(keys), 1)
    width = 4 + (2.5 if labels else 0)  # room for the labels beside each panel
    fig, axes = plt.subplots(1, n, figsize=(width * n, 0.3 * top + 1.5), squeeze=False)
    for ax, (site, layer) in zip(axes[0], keys, strict=False):
        sub = features[(features["site"] == site) & (features["layer"] == layer)]
        sub = sub.reindex(sub["score"].abs().sort_values(ascending=False).index).head(top)
        ticks = [feature_tick(site, layer, int(f), labels) for f in sub["feature"]]
        colours = [
            "#999999" if f < 0 else ("#2166ac" if s > 0 else "#b2182b")
            for f, s in zip(sub["feature"], sub["score"], strict=True)
        ]
        ax.barh(ticks[::-1], sub["score"].to_numpy()[::-1], color=colours[::-1])
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(f"{site} layer {layer}", fontsize=9)
        ax.set_xlabel("score")
    if not keys:
        axes[0][0].text(0.5, 0.5, "no SAEs", ha="center")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
