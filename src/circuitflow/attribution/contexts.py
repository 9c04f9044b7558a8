"""The top-activating contexts the attribution stages show beside a feature (the behaviour
graph's hover cards, the per-prompt graphs' feature cards), read from the features stage's
folders (`features/{site}/layer_{layer}/contexts.parquet`, its `top` contexts): the one pass
that also labels every feature, so neither stage runs the model or an encoder for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow import inputs

COLUMNS = [
    "site", "layer", "feature", "rank", "activation", "row", "context", "position", "tokens",
    "max_token", "text",
]  # fmt: skip


def top_contexts(
    feature_dirs: Sequence[Path | str],
    wanted: Mapping[tuple[str, int], Iterable[int]],
    n_contexts: int,
    tokenizer: Any = None,
) -> pd.DataFrame:
    """One row per (feature, rank) of the `wanted` features ({(site, layer): features}), their
    top `n_contexts` contexts (at most the stage's `features.k`), from whichever of
    `feature_dirs` holds their dictionary: `rank` from 1 by activation, `row` the token's row in
    an activation file of the token set (context x rows a context + position - BOS), the
    window's token ids and its text decoded with `tokenizer` (token strings joined by spaces
    without one), the activating token in [[...]]. Sorted by site, layer, feature and rank."""
    frames = []
    for folder in map(Path, feature_dirs):
        summary = inputs.json_file(folder / "summary.json", ("site", "layer", "first_position",
                                   "context_length"), "features", "feature summary")  # fmt: skip
        key = (summary["site"], int(summary["layer"]))
        feats = set(map(int, wanted.get(key, ())))
        if feats:
            frames.append(_folder_contexts(folder, summary, feats, n_contexts, tokenizer))
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    found = pd.concat(frames, ignore_index=True)
    return found.sort_values(["site", "layer", "feature", "rank"], ignore_index=True)[COLUMNS]


def _folder_contexts(
    folder: Path, summary: dict, features: set[int], n_contexts: int, tokenizer: Any
) -> pd.DataFrame:
    skip = int(summary["first_position"])
    rows_per_context = int(summary["context_length"]) - skip
    ctx = pd.read_parquet(folder / "contexts.parquet")
    top = ctx[(ctx["kind"] == "top") & ctx["feature"].isin(features) & (ctx["activation"] > 0)]
    top = top[top["rank"] < n_contexts]
    out = []
    for r in top.itertuples():
        ids, q = [int(t) for t in r.tokens], int(r.qualifying_index)
        words = list(r.token_str)
        token = _decode(tokenizer, ids[q : q + 1], words[q : q + 1])
        out.append({
            "site": summary["site"], "layer": int(summary["layer"]), "feature": int(r.feature),
            "rank": int(r.rank) + 1, "activation": float(r.activation),
            "row": int(r.context) * rows_per_context + int(r.position) - skip,
            "context": int(r.context), "position": int(r.position), "tokens": ids,
            "max_token": token,
            "text": f"{_decode(tokenizer, ids[:q], words[:q])} [[{token}]] "
            + _decode(tokenizer, ids[q + 1 :], words[q + 1 :]),
        })  # fmt: skip
    return pd.DataFrame(out)


def _decode(tokenizer: Any, ids: list[int], words: list[str]) -> str:
    if tokenizer is None:
        return " ".join(w.strip() for w in words)
    return tokenizer.decode(ids).strip()
