"""Figures of the attribution stage: head heatmap and top features per layer."""

from __future__ import annotations

import numpy as np
import pandas as pd

from circuitflow.plots import layer_head_grid, pyplot


def head_heatmap(heads: pd.DataFrame, n_layers: int, n_heads: int, title: str):
    """Layer x head grid of head scores, diverging colours centred on zero."""
    grid = np.zeros((n_layers, n_heads))
    for r in heads.itertuples():
        grid[int(r.layer), int(r.head)] = r.score
    return layer_head_grid(
        grid, lambda i, j: f"{grid[i, j]:.2g}", "RdBu", "effect on logit difference", title
    )


def top_features(features: pd.DataFrame, top: int, title: str):
    """One panel per (site, layer): the `top` features by |score|, error term included."""
    plt = pyplot()
    keys = sorted({(r.site, int(r.layer)) for r in features.itertuples()}, key=lambda k: k[1])
    n = max(len(keys), 1)
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 0.3 * top + 1.5), squeeze=False)
    for ax, (site, layer) in zip(axes[0], keys, strict=False):
        sub = features[(features["site"] == site) & (features["layer"] == layer)]
        sub = sub.reindex(sub["score"].abs().sort_values(ascending=False).index).head(top)
        labels = ["error" if f < 0 else f"f{f}" for f in sub["feature"]]
        colours = [
            "#999999" if f < 0 else ("#2166ac" if s > 0 else "#b2182b")
            for f, s in zip(sub["feature"], sub["score"], strict=True)
        ]
        ax.barh(labels[::-1], sub["score"].to_numpy()[::-1], color=colours[::-1])
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(f"{site} layer {layer}", fontsize=9)
        ax.set_xlabel("score")
    if not keys:
        axes[0][0].text(0.5, 0.5, "no SAEs", ha="center")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
