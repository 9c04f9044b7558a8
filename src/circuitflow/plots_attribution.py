"""Figures of the attribution stage: head heatmap and top features per layer."""

from __future__ import annotations

import numpy as np
import pandas as pd


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def head_heatmap(heads: pd.DataFrame, n_layers: int, n_heads: int, title: str):
    """Layer x head grid of head scores, diverging colours centred on zero."""
    plt = _plt()
    grid = np.zeros((n_layers, n_heads))
    for r in heads.itertuples():
        grid[int(r.layer), int(r.head)] = r.score
    lim = max(float(np.abs(grid).max()), 1e-9)
    fig, ax = plt.subplots(figsize=(1 + 0.5 * n_heads, 1 + 0.4 * n_layers))
    im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    if n_layers * n_heads <= 64:
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="effect on logit difference")
    ax.set_title(title)
    return fig


def top_features(features: pd.DataFrame, top: int, title: str):
    """One panel per (site, layer): the `top` features by |score|, error term included."""
    plt = _plt()
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
