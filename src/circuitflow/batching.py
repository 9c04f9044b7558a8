"""How the stages after `prompts` group and split a behaviour's prompts.

`by_length` batches prompts of one token length together (no padding, so no attention masks);
`selection_half` splits the prompts into the half circuits are chosen on and the held-out half
they are scored on. Baseline, attribution and interventions all use these, so every stage
batches and splits a prompt set the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def by_length(token_lists) -> list[np.ndarray]:
    """Row indices of prompts grouped by token length, in first-seen order: stages batch prompts
    of one length together (no padding, so no attention-mask subtleties)."""
    groups: dict[int, list[int]] = {}
    for i, tokens in enumerate(token_lists):
        groups.setdefault(len(tokens), []).append(i)
    return [np.asarray(rows) for rows in groups.values()]


def selection_half(prompts: pd.DataFrame) -> np.ndarray:
    """True for the prompts circuits are chosen on (even `prompt_id`), False for the held-out
    half they are scored on (odd). Prompt ids follow generation order, so the halves are two
    random halves of the behaviour; attribution and interventions split alike."""
    return (prompts["prompt_id"].to_numpy() % 2) == 0
