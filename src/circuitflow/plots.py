"""Figure helpers shared by the stages' plotting modules."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (jobs have no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def layer_head_grid(
    grid: np.ndarray,
    cell_text: Callable[[int, int], str],
    cmap: str,
    colorbar_label: str,
    title: str,
    cell_size: tuple[float, float] = (0.5, 0.4),
    margin: float = 1.0,
):
    """A layer x head heatmap with diverging colours centred on zero; cells are labelled with
    `cell_text(layer, head)` when the grid is small enough to read (at most 64 heads)."""
    plt = pyplot()
    n_layers, n_heads = grid.shape
    finite = np.abs(grid[np.isfinite(grid)])  # all NaN: a drop fraction of a metric at 0
    lim = max(float(finite.max()) if finite.size else 0.0, 1e-9)
    size = (margin + cell_size[0] * n_heads, 1 + cell_size[1] * n_layers)
    fig, ax = plt.subplots(figsize=size)
    im = ax.imshow(grid, cmap=cmap, vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    if n_layers * n_heads <= 64:
        for (i, j), _ in np.ndenumerate(grid):
            ax.text(j, i, cell_text(i, j), ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, label=colorbar_label)
    ax.set_title(title, fontsize=9)
    return fig
