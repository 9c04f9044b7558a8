"""Figures of the interventions stage: faithfulness and completeness curves with the random
control band, the single-head ablation heatmap, head sets against their additive prediction,
steering curves, and head effects across behaviours."""

from __future__ import annotations

import numpy as np
import pandas as pd

from circuitflow.plots import layer_head_grid, pyplot


def circuit_curves(curves: pd.DataFrame, threshold: float, title: str):
    """Faithfulness and completeness of the top-n circuit against n, on the selection half the
    circuit was chosen on (solid) and the held-out half (dashed), with the random circuits'
    mean and 5-95% band (selection half)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharex=True)
    top = curves[curves["circuit"] == "top"].drop_duplicates("n").sort_values("n")
    rand = curves[curves["circuit"] == "random"]
    for ax, metric in zip(axes, ("faithfulness", "completeness"), strict=True):
        if len(rand):
            g = rand.groupby("n")[metric]
            q = pd.DataFrame({"mean": g.mean(), "lo": g.quantile(0.05), "hi": g.quantile(0.95)})
            ax.fill_between(q.index, q["lo"], q["hi"], color="0.7", alpha=0.5, label="random 5-95%")
            ax.plot(q.index, q["mean"], color="0.4", ls="--", label="random mean")
        for half, style, label in (("", "-", "selection half"), ("_heldout", "--", "held out")):
            ax.errorbar(
                top["n"],
                top[f"{metric}{half}"],
                yerr=top[f"{metric}{half}_std"].fillna(0),
                marker="o",
                ms=3,
                ls=style,
                color="C0" if not half else "C2",
                label=f"top-n by attribution, {label}",
            )
        graph = curves[curves["circuit"] == "graph"]
        if len(graph):
            ax.plot(graph["n"], graph[f"{metric}_heldout"], "D", color="C1",
                    label="attribution graph (held out)")  # fmt: skip
        if metric == "faithfulness":
            ax.axhline(threshold, color="C3", lw=0.8, ls=":", label=f"{threshold:g}")
        ax.axhline(0, color="k", lw=0.5)
        ax.axhline(1, color="k", lw=0.5)
        if top["n"].max() > 64:  # hundreds of feature nodes: small circuits need the room
            ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("circuit size n (nodes)")
        ax.set_ylabel(metric)
        ax.legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def head_heatmap(heads: pd.DataFrame, n_layers: int, n_heads: int, title: str):
    """Layer x head grid: share of the logit difference lost when the head is ablated."""
    grid = np.zeros((n_layers, n_heads))
    err = np.zeros((n_layers, n_heads))
    for r in heads.itertuples():
        grid[int(r.layer), int(r.head)] = r.drop_frac
        err[int(r.layer), int(r.head)] = r.drop_frac_std
    return layer_head_grid(
        grid,
        lambda i, j: f"{grid[i, j]:.0%}\n±{err[i, j]:.0%}",
        "RdBu_r",
        "logit-difference drop (share)",
        f"{title}: single-head ablation",
        cell_size=(0.7, 0.5),
        margin=1.5,
    )


def head_sets(sets: pd.DataFrame, title: str, top: int = 15):
    """The largest pair/triplet effects against their additive prediction; grey band: random
    sets of the same size (5-95%)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if sets.empty:
        ax.text(0.5, 0.5, "no head sets", ha="center", va="center")
        return fig
    tk = sets[sets["set"] == "top_k"].sort_values("score", ascending=False).head(top)
    x = np.arange(len(tk))
    ax.bar(x - 0.2, tk["score"], 0.4, yerr=tk["score_std"], label="ablated together")
    ax.bar(x + 0.2, tk["additive"], 0.4, label="sum of single ablations")
    labels = list(tk["heads"])
    rand = sets[sets["set"] == "random"]
    for i, (size, g) in enumerate(rand.groupby("size")):
        mean, lo, hi = g["score"].mean(), g["score"].quantile(0.05), g["score"].quantile(0.95)
        xi = len(tk) + i
        ax.bar(xi, mean, 0.6, yerr=[[mean - lo], [hi - mean]], color="0.6",
               label="random sets (mean, 5-95%)" if i == 0 else None)  # fmt: skip
        labels.append(f"random, {size} heads")
    ax.set_xticks(np.arange(len(labels)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("logit-difference drop")
    ax.axhline(0, color="k", lw=0.5)
    ax.legend(fontsize=7)
    ax.set_title(f"{title}: head pairs and triplets", fontsize=9)
    return fig


def steering(steer: pd.DataFrame, title: str):
    """Logit difference as alpha varies, per feature (solid) and its random direction (dashed)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if steer.empty:
        ax.text(0.5, 0.5, "no SAE features to steer", ha="center", va="center")
        return fig
    for i, ((site, layer, feature), g) in enumerate(steer.groupby(["site", "layer", "feature"])):
        for direction, ls in (("feature", "-"), ("random", "--")):
            d = g[g["direction"] == direction].sort_values("alpha")
            label = f"{site}{layer}/F{feature}" + (" random dir." if direction == "random" else "")
            ax.plot(
                d["alpha"], d["logit_diff"], ls=ls, marker="o", ms=3, color=f"C{i}", label=label
            )
    ax.set_xlabel("alpha (times the decoder direction)")
    ax.set_ylabel("logit difference")
    ax.axhline(0, color="k", lw=0.5)
    ax.legend(fontsize=6)
    ax.set_title(f"{title}: feature steering", fontsize=9)
    return fig


def heads_across(frame: pd.DataFrame, title: str = "single-head ablation across behaviours"):
    """Behaviour x head grid of drop_frac."""
    plt = pyplot()
    frame = frame.assign(label=[f"L{r.layer}H{r.head}" for r in frame.itertuples()])
    grid = frame.pivot_table(index="behaviour", columns="label", values="drop_frac", sort=False)
    lim = max(float(np.nanmax(np.abs(grid.to_numpy()))), 1e-9) if grid.size else 1.0
    fig, ax = plt.subplots(figsize=(2 + 0.45 * grid.shape[1], 1 + 0.5 * grid.shape[0]))
    im = ax.imshow(grid.to_numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_xticklabels(grid.columns, rotation=90, fontsize=7)
    ax.set_yticks(range(grid.shape[0]))
    ax.set_yticklabels(grid.index)
    if grid.size <= 160:
        for (i, j), v in np.ndenumerate(grid.to_numpy()):
            ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, label="logit-difference drop (share)")
    ax.set_title(title, fontsize=9)
    return fig
