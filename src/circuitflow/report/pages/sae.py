"""The SAE page: metrics per site and layer (L0, explained variance, CE loss recovered, dead
fraction) from every dictionary's metrics.json, the dead and dense fractions of the features
stage's pass (one definition whatever the dictionary's source), and the L0 controller's
history."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from circuitflow.report import inputs

SAE_COLUMNS = [
    "site",
    "layer",
    "kind",  # sae, or transcoder: its explained variance and CE are of the MLP it replaces
    "architecture",
    "d_in",
    "d_sae",
    "l0",
    "explained_variance",
    "ce_loss_recovered",
    "dead_fraction",
    "ce_clean",
    "ce_sae",
    "ce_zero",
    "tokens_trained",
    "wall_time_s",
    "peak_memory_mb",
    "device",
    "resumed",
]
# From features/{site}/layer_{layer}/summary.json: the same pass over the same tokens for every
# dictionary, trained or published (metrics.json's dead_fraction is its source's: training's
# window, or a published dictionary's evaluation contexts).
FEATURE_COLUMNS = {"features_dead_fraction": "dead_fraction",
                   "features_dense_fraction": "dense_fraction"}  # fmt: skip


def read_sae_metrics(sae_dirs: list[Path | str]) -> list[dict]:
    """Every dictionary's metrics.json, each holding the columns the table shows (every source
    writes them: sae/lifecycle.py's METRICS_KEYS)."""
    return [
        inputs.json_of(Path(d) / "metrics.json", tuple(SAE_COLUMNS), "the SAE stage", "SAE metrics")
        for d in sae_dirs
    ]


def read_feature_fractions(feature_dirs: list[Path | str]) -> dict[tuple[str, int], dict]:
    """(site, layer) -> the features stage's dead and dense fractions of that dictionary."""
    keys = ("site", "layer", *FEATURE_COLUMNS.values())
    out = {}
    for folder in feature_dirs:
        s = inputs.json_of(Path(folder) / "summary.json", keys, "the features stage", "features")
        out[(s["site"], int(s["layer"]))] = {c: s[k] for c, k in FEATURE_COLUMNS.items()}
    return out


def sae_table(metrics: list[dict], fractions: dict | None = None) -> pd.DataFrame:
    """One row per dictionary; with `fractions` (read_feature_fractions) the features pass's
    dead and dense fractions beside its own."""
    columns = SAE_COLUMNS + (list(FEATURE_COLUMNS) if fractions else [])
    rows = [
        {c: m[c] for c in SAE_COLUMNS} | (fractions or {}).get((m["site"], int(m["layer"])), {})
        for m in metrics
    ]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["site", "layer"]).reset_index(drop=True)


def plot_sae_metrics(frame: pd.DataFrame):
    """One panel per metric, one line per site, layers on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("l0", "L0 (active latents per token)"),
        ("explained_variance", "explained variance"),
        ("ce_loss_recovered", "CE loss recovered"),
        ("dead_fraction", "dead fraction"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (col, label) in zip(axes[0], panels, strict=True):
        for site, group in frame.groupby("site"):
            ax.plot(group["layer"], group[col].astype(float), "o-", label=site)
        ax.set_title(label)
        ax.set_xlabel("layer")
        ax.set_xticks(sorted(frame["layer"].unique()))
        if col in ("explained_variance", "ce_loss_recovered", "dead_fraction"):
            ax.set_ylim(min(0.0, ax.get_ylim()[0]), max(1.05, ax.get_ylim()[1]))
        ax.grid(alpha=0.3)
    axes[0][0].legend(title="site", fontsize=8)
    fig.suptitle("SAE metrics per layer")
    fig.tight_layout()
    return fig


def plot_controller(metrics: list[dict]):
    """L0 and the sparsity coefficient over training for SAEs with a controller (standard,
    jumprelu); a note for TopK SAEs, whose L0 is fixed by k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l0, ax_coef) = plt.subplots(1, 2, figsize=(10, 3.4))
    drawn = 0
    for m in sorted(metrics, key=lambda m: (m.get("site", ""), m.get("layer", 0))):
        history = m.get("controller_history") or []
        if not history:
            continue
        label = f"{m.get('site')} L{m.get('layer')}"
        steps = [h["step"] for h in history]
        ax_l0.plot(steps, [h["l0"] for h in history], label=label)
        ax_coef.plot(steps, [h["coefficient"] for h in history], label=label)
        drawn += 1
    target = next((m["config"].get("target_l0") for m in metrics if m.get("config")), None)
    if drawn and target:
        ax_l0.axhline(target, color="grey", ls="--", label="target L0")
    if not drawn:
        archs = sorted({str(m.get("architecture")) for m in metrics})
        for ax in (ax_l0, ax_coef):
            ax.text(
                0.5,
                0.5,
                f"no L0 controller: architecture {', '.join(archs)}\n(L0 is fixed by k)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
    else:
        ax_l0.legend(fontsize=8)
    ax_l0.set(title="L0 during training", xlabel="step", ylabel="L0")
    ax_coef.set(title="sparsity coefficient", xlabel="step", ylabel="coefficient")
    fig.tight_layout()
    return fig
