"""Labels of features: the deterministic labellers, their held-out scores and control, which
label a dictionary shows, and the one text every place that shows a label shows (`shown`).

**Labellers** (`LABELLERS`; each a rule of features/rules.py per feature, with its words):

- `tokens`: the `n_tokens` tokens with the largest summed activation over the feature's top
  contexts (ties: the earlier in rank) and the token it promotes most, e.g. `fires on " Paris"
  / " London"; promotes " France"`; its rule: the token at the position is one it names;
- `rules`: per feature the rule that best predicts firing on the contexts the labels are
  written from (features/scores.py `choose`), e.g. `fires before "r7" when repeated in its
  context; promotes "r7"`, with the token it fires on most where the rule does not name it,
  `fires before "a0" / "a1" / "a8" (strongest on "s16"); promotes "a9"` (a feature of every
  subject, strongest on one: the rule is what is scored).

An explainer (features/explainer.py, a language model) writes free text instead; it is scored
by detection, on the same held-out tokens.

**Scores.** Every labeller's rule is counted on the held-out contexts (features/held_out.py):
precision, recall, F1 and the counts behind them, and the control (scores.control_order: each
feature scored with another live feature's rule). `features.labeller` says which labeller a
dictionary shows: `best` the one with the higher held-out mean F1 over its live features (per
dictionary, not per feature, so the score shown was not picked on the positions it is measured
on).

**Shown text** (`shown`): the label with its F1, `fires on "a" (F1 0.91)`, led by `weak (F1
0.21): ` below WEAK_F1; `dead` for a feature that never fired; ` (unscored)` where a folder has
no score (written before labels were scored). The graphs' `clerp`, graph pages, report tables
and figures take it from `read.read_labels`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from circuitflow.features.config import DETERMINISTIC
from circuitflow.features.read import WEAK_F1, shown
from circuitflow.features.rules import CUR, RuleTable, show
from circuitflow.features.scores import STRONG_F1, Scores, summarise

__all__ = [
    "DETERMINISTIC",
    "LABELLERS",
    "WEAK_F1",
    "label_columns",
    "shown",
    "texts",
    "token_rules",
]

LABELLERS = ("tokens", "rules")  # the deterministic labellers, scored every run
TOKEN_LABEL_TOKENS = 2  # tokens the `tokens` labeller names


def token_rules(
    feature: np.ndarray, token: np.ndarray, value: np.ndarray, n_features: int,
    n_tokens: int = TOKEN_LABEL_TOKENS,
) -> RuleTable:  # fmt: skip
    """The `tokens` labeller's rules: for each feature, from its top entries (`feature`,
    `token` id at the entry, activation `value`, in rank order), the `n_tokens` tokens of
    largest summed activation (ties: the earlier in rank); NONE for a feature with none."""
    table = RuleTable.empty(n_features)
    frame = pd.DataFrame({"feature": feature, "token": token, "value": value})
    frame = frame[frame["token"] >= 0]
    frame["rank"] = np.arange(len(frame))
    weight = frame.groupby(["feature", "token"], sort=False).agg(
        value=("value", "sum"), rank=("rank", "min")
    )
    weight = weight.reset_index().sort_values(["feature", "value", "rank"],
                                              ascending=[True, False, True])  # fmt: skip
    for f, g in weight.groupby("feature", sort=False):
        table.set(int(f), CUR, 0, g["token"].to_numpy()[:n_tokens].tolist())
    return table


def texts(table: RuleTable, vocab: Sequence[str], conditions: list[str],
          promoted: Sequence[str], strongest: RuleTable | None = None) -> list[str]:  # fmt: skip
    """Each feature's label: its rule in words and the token it promotes most (`promoted[f]`,
    "" for none), `fires on "a"; promotes "b"`; `dead` where the rule is NONE. `strongest`
    (the `tokens` labeller's rules): where the rule does not name it, the token the feature
    fires on most in its top contexts, `fires before "a0" / "a1" (strongest on "s16")`: a
    description of its top contexts beside the rule, not part of what is scored."""
    out = []
    for f in range(len(table)):
        words = table.text(f, vocab, conditions)
        if not words:
            out.append("dead")
            continue
        if strongest is not None and strongest.atoms[f, 0] >= 0:
            top = int(strongest.atoms[f, 0])
            if not (table.kind[f] == CUR and top in table.atoms[f]):
                words += f" (strongest on {show(vocab[top])})"
        out.append(f"{words}; promotes {show(promoted[f])}" if promoted[f] else words)
    return out


def pick(config_labeller: str, means: dict[str, float | None]) -> str:
    """The labeller a dictionary shows: `config_labeller` where it names one of `means`' keys,
    else (`best`, or an explainer where its scores are among `means`) the one of highest mean
    F1 (ties: the first)."""
    if config_labeller in means:
        return config_labeller
    return max(means, key=lambda name: -1.0 if means[name] is None else means[name])


def label_columns(
    names: Sequence[str], labels: dict[str, list[str]], scores: dict[str, Scores],
    controls: dict[str, Scores], live: np.ndarray, config_labeller: str,
) -> tuple[pd.DataFrame, dict]:  # fmt: skip
    """features.parquet's label columns (docs/outputs.md) and summary.json's `labels` block,
    from each labeller's labels, held-out scores and control scores (`names` in order)."""
    blocks = {
        name: summarise(scores[name], live) | {"control": summarise(controls[name], live)}
        for name in names
    }
    chosen = pick(config_labeller, {n: blocks[n]["mean_f1"] for n in names})
    s, c = scores[chosen], controls[chosen]
    cols = {
        "label": labels[chosen],
        "labeller": chosen,
        "label_precision": s.precision,
        "label_recall": s.recall,
        "label_f1": s.f1,
        "label_tp": s.tp,
        "label_fp": s.fp,
        "label_fn": s.fn,
        "label_control_f1": c.f1,
    }
    for name in names:
        cols[f"label_{name}"] = labels[name]
        cols[f"label_{name}_f1"] = scores[name].f1
    summary = {
        "shown": chosen,
        "config": config_labeller,
        "strong_f1": STRONG_F1,
        "weak_f1": WEAK_F1,
        "labellers": blocks,
    }
    return pd.DataFrame(cols), summary
