"""One dictionary's feature files: `features/{site}/layer_{layer}/`, written atomically (the
folder appears complete or not at all).

`features.parquet`, one row a feature:

- `feature`: the feature's index in the dictionary;
- `count`, `density`: tokens it fired on (activation > 0), and count / `n_tokens`;
- `log10_density`: log10 of density (null for a dead feature);
- `max_activation`, `mean_activation`: its largest activation; its mean where it fired;
- `dead`, `dense`: never fired; density above `dense_threshold`;
- `label`, `labeller`: the label shown and the labeller that wrote it (labels.py);
- `label_precision`, `label_recall`, `label_f1`: how well its rule predicts where the feature
  fires on the held-out tokens (0 where there is nothing to divide; NaN where unscored);
- `label_tp`, `label_fp`, `label_fn`: the held-out counts behind them;
- `label_control_f1`: the F1 of another live feature's label of that labeller (the control);
- `label_tokens`, `label_tokens_f1`, `label_rules`, `label_rules_f1`: each deterministic
  labeller's label and held-out F1;
- `hist`: counts of its positive activations in the bins `summary.json`'s `hist_edges`;
- `promoted_ids`, `promoted_str`, `promoted_values`: the k tokens its decoder direction raises
  most through the unembedding (`logits.py`), descending;
- `suppressed_ids`, `suppressed_str`, `suppressed_values`: the k it lowers most, ascending;
- `logit_hist_lo`, `logit_hist_hi`, `logit_hist`: a histogram of its effects on every token,
  equal bins from lo to hi.

`contexts.parquet`, one row a kept context of a feature:

- `feature`: the feature;
- `kind`: `top` (the k largest activations over all tokens) or `quantile` (sampled in a band);
- `band`: the quantile band's index (`summary.json`'s `quantile_bands`); -1 for `top`;
- `band_lo`, `band_hi`, `band_share`: the band's activation range [lo, hi) and the share of
  the feature's firing tokens in it (NaN for `top`);
- `rank`: order within the kind and band: by activation for `top` (ties: the earlier token),
  by sampling priority for `quantile`;
- `context`, `position`: the token's context (row of the token set fed) and position in it;
- `activation`: the feature's activation at that token;
- `window_start`, `qualifying_index`: the window's first position in the context; the token's
  index in the window;
- `tokens`, `token_str`, `values`: the window's token ids, their strings, and the feature's
  activation at each.

`summary.json`: `n_features`, `n_tokens`, `n_contexts`, `context_length`, `first_position`,
`k`, `samples`, `seed`, `hist_edges` (the last is +inf, written null), `quantile_bands`,
`dense_threshold`, `log_density_edges` and `log_density_hist` (over the features that fired),
`dead` and `dense` (feature lists), `dead_fraction`, `dense_fraction`, `labeller` (the labeller
shown), `labels` (each labeller's held-out score distribution and control: labels.label_columns),
`window` ([left, right]), `final_norm` (how `logits.py` treated it), and whatever the caller
passes as `meta` (site, layer, hook, dictionary kind, which tokens were read).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from circuitflow.features.collect import (
    BIN_EDGES,
    LOG_DENSITY_EDGES,
    QUANTILE_BANDS,
    FeatureStats,
)
from circuitflow.features.labels import texts, token_rules
from circuitflow.features.logits import Logits
from circuitflow.features.read import read_labels, read_neuronpedia_ids
from circuitflow.features.windows import Reader, Windows, read_windows
from circuitflow.io import atomic_dir, json_text, write_json, write_parquet

__all__ = [
    "build", "feature_dir", "kept_contexts", "read_labels", "read_neuronpedia_ids", "write",
    "FINAL_NORM",
]  # fmt: skip

FINAL_NORM = (
    "decoder rows centred over d_model for a LayerNorm model, final norm scale folded into "
    "W_U, 1/norm left out, effects centred over the vocabulary (features/logits.py)"
)


def feature_dir(outdir: Path | str, site: str, layer: int) -> Path:
    return Path(outdir) / "features" / site / f"layer_{layer}"


def kept_contexts(stats: FeatureStats) -> pd.DataFrame:
    """One row per kept (feature, context, position), before the windows are read."""
    f, k = stats.top_context.shape
    feat = np.repeat(np.arange(f), k)
    top = pd.DataFrame(
        {
            "feature": feat,
            "kind": "top",
            "band": -1,
            "band_lo": np.nan,
            "band_hi": np.nan,
            "band_share": np.nan,
            "rank": np.tile(np.arange(k), f),
            "context": stats.top_context.ravel(),
            "position": stats.top_position.ravel(),
        }
    )
    _, nb, s = stats.sample_context.shape
    quant = pd.DataFrame(
        {
            "feature": np.repeat(np.arange(f), nb * s),
            "kind": "quantile",
            "band": np.tile(np.repeat(np.arange(nb), s), f),
            "band_lo": np.repeat(stats.band_lo.ravel(), s),
            "band_hi": np.repeat(stats.band_hi.ravel(), s),
            "band_share": np.repeat(stats.band_share.ravel(), s),
            "rank": np.tile(np.arange(s), f * nb),
            "context": stats.sample_context.ravel(),
            "position": stats.sample_position.ravel(),
        }
    )
    rows = pd.concat([top, quant], ignore_index=True)
    return rows[rows["context"] >= 0].reset_index(drop=True)


def build(
    stats: FeatureStats,
    logits: Logits,
    read: Reader | None,
    vocab: Sequence[str],
    window: tuple[int, int] = (12, 4),
    first_position: int = 0,
    meta: dict[str, Any] | None = None,
    windows: Windows | None = None,
    labels: pd.DataFrame | None = None,
    labels_summary: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The three outputs: features, contexts (windows read through `read`, or `windows` read
    already for `kept_contexts(stats)`'s rows, in order) and the summary. `vocab[i]` is token
    i's string. `labels`: the label columns, one row a feature (labels.label_columns), and
    `labels_summary` summary.json's `labels`; without them, the tokens labeller's labels,
    unscored."""
    ctx = kept_contexts(stats)
    if windows is None:
        windows = read_windows(
            ctx["feature"].to_numpy(),
            ctx["context"].to_numpy(),
            ctx["position"].to_numpy(),
            read,
            left=window[0],
            right=window[1],
            first_position=first_position,
        )
    toks, vals, start, qual = windows
    ctx["activation"] = np.array([v[q] for v, q in zip(vals, qual, strict=True)], np.float32)
    ctx["window_start"] = start
    ctx["qualifying_index"] = qual
    ctx["tokens"] = toks
    ctx["token_str"] = [[vocab[t] for t in w] for w in toks]
    ctx["values"] = vals

    def strs(ids: np.ndarray) -> list[list[str]]:
        return [[vocab[i] for i in row] for row in ids]

    n = len(stats.count)
    feats = pd.DataFrame(
        {
            "feature": np.arange(n),
            "count": stats.count,
            "density": stats.density,
            "log10_density": np.where(
                stats.count > 0, np.log10(np.maximum(stats.density, 1e-300)), np.nan
            ),
            "max_activation": stats.max,
            "mean_activation": stats.mean,
            "dead": stats.count == 0,
            "dense": stats.density > stats.dense_threshold,
            "hist": list(stats.hist),
            "promoted_ids": list(logits.top_ids),
            "promoted_str": strs(logits.top_ids),
            "promoted_values": list(logits.top_values),
            "suppressed_ids": list(logits.bottom_ids),
            "suppressed_str": strs(logits.bottom_ids),
            "suppressed_values": list(logits.bottom_values),
            "logit_hist_lo": logits.hist_lo,
            "logit_hist_hi": logits.hist_hi,
            "logit_hist": list(logits.hist),
        }
    )
    if labels is None:  # unscored: the tokens labeller on the top contexts alone
        top = ctx[ctx["kind"] == "top"]
        ids = [int(w[q]) for w, q in zip(top["tokens"], top["qualifying_index"], strict=True)]
        table = token_rules(top["feature"].to_numpy(), np.asarray(ids, dtype=np.int64),
                            top["activation"].to_numpy(), n)  # fmt: skip
        promoted = [p[0] if len(p) else "" for p in feats["promoted_str"]]
        labels = unscored(texts(table, vocab, [""], promoted))
        labels_summary = {"shown": "tokens", "config": "tokens", "labellers": {}}
    at = feats.columns.get_loc("dense") + 1
    for i, col in enumerate(labels.columns):
        feats.insert(at + i, col, labels[col].to_numpy())
    summary = {
        **(meta or {}),
        "n_features": n,
        "n_tokens": stats.n_tokens,
        "n_contexts": stats.n_contexts,
        "context_length": stats.context_length,
        "first_position": first_position,
        "k": stats.top_context.shape[1],
        "samples": stats.sample_context.shape[2],
        "seed": stats.seed,
        "hist_edges": BIN_EDGES.tolist(),
        "quantile_bands": list(QUANTILE_BANDS),
        "dense_threshold": stats.dense_threshold,
        "log_density_edges": LOG_DENSITY_EDGES.tolist(),
        "log_density_hist": stats.log_density_hist.tolist(),
        "dead": stats.dead.tolist(),
        "dense": stats.dense.tolist(),
        "dead_fraction": len(stats.dead) / max(n, 1),
        "dense_fraction": len(stats.dense) / max(n, 1),
        "labeller": str(labels["labeller"].iloc[0]) if n else "tokens",
        "window": list(window),
        "final_norm": FINAL_NORM,
    }
    if labels_summary is not None:
        summary["labels"] = labels_summary
    return feats, ctx, summary


def example_table(examples: dict, vocab: Sequence[str]) -> pd.DataFrame:
    """examples.parquet from held_out.examples' columns, with each window's token strings."""
    table = pd.DataFrame(examples)
    table["token_str"] = [[vocab[t] for t in w] for w in table["tokens"]]
    return table


def unscored(token_labels: list[str]) -> pd.DataFrame:
    """The label columns of the tokens labeller's labels where nothing scored them (NaN)."""
    nan = np.full(len(token_labels), np.nan)
    cols = {"label": token_labels, "labeller": "tokens"}
    cols |= {f"label_{c}": nan for c in ("precision", "recall", "f1", "tp", "fp", "fn")}
    cols |= {"label_control_f1": nan, "label_tokens": token_labels, "label_tokens_f1": nan,
             "label_rules": "", "label_rules_f1": nan}  # fmt: skip
    return pd.DataFrame(cols)


def write(
    folder: Path | str, features: pd.DataFrame, contexts: pd.DataFrame, summary: dict,
    examples: pd.DataFrame | None = None,
) -> Path:  # fmt: skip
    """Write the files into `folder` (e.g. `feature_dir(outdir, site, layer)`), replacing it
    as a whole only once every file is complete: features, contexts, summary and, where given,
    the held-out examples."""
    folder = Path(folder)
    json_text(summary)  # fail before anything is written if the summary is not JSON
    with atomic_dir(folder) as tmp:
        write_parquet(tmp / "features.parquet", features)
        write_parquet(tmp / "contexts.parquet", contexts)
        if examples is not None:
            write_parquet(tmp / "examples.parquet", examples)
        write_json(tmp / "summary.json", summary)
    return folder
