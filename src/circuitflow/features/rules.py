"""The rules a label states about where its feature fires, as predicates over token positions.

A rule is `kind`, `condition` and up to `MAX_ATOMS` token ids (`atoms`):

- kind `CUR` (the token at the position is one of the atoms: `fires on "a" / "b"`), `PREV`
  (the token before it is: `fires after "a"`), `NEXT` (the token after it is: `fires before
  "a"`), or `CONTEXT` (no token named: `fires on any token`); `NONE` predicts nothing (a dead
  feature's);
- `condition`, an index into `condition_names(context_length)`, restricts the positions: 0 is
  every position; then whether the token occurred earlier in its context (repeated, or the
  first time), whether the position sits in a repeated segment (its bigram occurred earlier:
  the second copy of a repeated stretch of text) or not, and position ranges (`at positions <=
  q` and `> q` at eighths of the context length).

The atoms of one rule are distinct tokens of one kind, so the positions they hold at are
disjoint: a rule's counts (positions it predicts, and of those where its feature fires) are the
sums of its atoms' counts. That is what lets features/scores.py choose and score rules from
counts per atom, a few integers per feature, never a [positions, features] table.

`position_keys` gives, for a batch of contexts, each counted position's keys (its token, the
one before, the one after; -1 where there is none) and its cell (its position range, whether
its token is repeated, whether it sits in a repeated segment: every condition is a union of
cells, `cell_conditions`), on the device the tokens are on, without a host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# The rules' shape, which the features plan reads without numpy or torch: state.py.
from circuitflow.features.state import MAX_ATOMS, n_cells, position_thresholds

__all__ = [
    "CONTEXT",
    "CUR",
    "KINDS",
    "MAX_ATOMS",
    "NEXT",
    "NONE",
    "PREV",
    "RuleTable",
    "cell_conditions",
    "condition_names",
    "n_cells",
    "position_keys",
    "position_thresholds",
]

NONE, CUR, PREV, NEXT, CONTEXT = -1, 0, 1, 2, 3
KINDS = (CUR, PREV, NEXT)  # the kinds that name tokens: a column of position_keys each
KIND_WORDS = {CUR: "fires on", PREV: "fires after", NEXT: "fires before"}
# The conditions after 0 (every position) that do not depend on the context's length.
SEGMENT_CONDITIONS = (
    "when repeated in its context",
    "the first time in its context",
    "in a repeated segment",
    "outside repeated segments",
)


def condition_names(context_length: int) -> list[str]:
    """The conditions' words, by index: "" (every position), SEGMENT_CONDITIONS, then each
    threshold's `at positions <= q` and `at positions > q` (positions count from 0, the
    context's first token)."""
    names = ["", *SEGMENT_CONDITIONS]
    for q in position_thresholds(context_length):
        names += [f"at positions <= {q}", f"at positions > {q}"]
    return names


def cell_conditions(context_length: int) -> np.ndarray:
    """[cells, conditions] bool: which conditions of `condition_names` each cell meets (a
    cell is `range * 4 + repeated * 2 + segment`; range r holds the positions above r of the
    thresholds)."""
    qs = position_thresholds(context_length)
    out = []
    for r in range(len(qs) + 1):
        for repeated in (False, True):
            for segment in (False, True):
                row = [True, repeated, not repeated, segment, not segment]
                for i in range(len(qs)):
                    row += [r <= i, r > i]  # positions <= qs[i] are the ranges 0..i
                out.append(row)
    return np.array(out, dtype=bool)


@torch.no_grad()
def position_keys(tokens: torch.Tensor, first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """For contexts `tokens` [B, T]: (keys [B * (T - first), 3] int64, the token at, before and
    after each position from `first` on, -1 where there is none; cells [B * (T - first)] int64,
    the cell of each (`n_cells`)), positions in row-major order, as a dictionary's activations
    [B, T - first, F] flatten."""
    tokens = tokens.long()
    b, t = tokens.shape
    dev = tokens.device
    none = torch.full((b, 1), -1, dtype=torch.long, device=dev)
    prev = torch.cat([none, tokens[:, :-1]], 1)
    nxt = torch.cat([tokens[:, 1:], none], 1)
    earlier = torch.ones(t, t, dtype=torch.bool, device=dev).tril(-1)  # [j, i]: i < j
    repeated = ((tokens[:, :, None] == tokens[:, None, :]) & earlier).any(2)
    # A bigram's code (prev, token), token ids below 2**31; -1 at position 0 (no bigram).
    bigram = torch.where(prev >= 0, prev * 2**31 + tokens, -1)
    same = (bigram[:, :, None] == bigram[:, None, :]) & (bigram[:, :, None] >= 0)
    segment = (same & earlier).any(2)
    qs = torch.tensor(position_thresholds(t), dtype=torch.long, device=dev)
    position_range = torch.bucketize(torch.arange(t, device=dev), qs)  # thresholds below
    cells = position_range * 4 + repeated.long() * 2 + segment.long()
    keys = torch.stack([tokens, prev, nxt], -1)[:, first:].reshape(-1, len(KINDS))
    return keys, cells[:, first:].reshape(-1)


@dataclass
class RuleTable:
    """One rule per feature, as arrays (numpy, F features): `kind` [F], `condition` [F] and
    `atoms` [F, MAX_ATOMS] (token ids, -1 past a rule's last)."""

    kind: np.ndarray
    condition: np.ndarray
    atoms: np.ndarray

    @classmethod
    def empty(cls, n_features: int) -> RuleTable:
        return cls(
            np.full(n_features, NONE, dtype=np.int64),
            np.zeros(n_features, dtype=np.int64),
            np.full((n_features, MAX_ATOMS), -1, dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.kind)

    def set(self, feature: int, kind: int, condition: int, atoms=()) -> None:
        atoms = list(atoms)[:MAX_ATOMS]
        self.kind[feature], self.condition[feature] = kind, condition
        self.atoms[feature] = atoms + [-1] * (MAX_ATOMS - len(atoms))

    def take(self, order: np.ndarray) -> RuleTable:
        """The rules of features `order` (feature i gets feature order[i]'s rule)."""
        return RuleTable(self.kind[order], self.condition[order], self.atoms[order])

    def text(self, feature: int, vocab, conditions: list[str]) -> str:
        """The rule in words: `fires on "a" / "b" when repeated in its context`, `fires after
        "a"`, `fires on any token at positions > 24`; "" for NONE."""
        kind, cond = int(self.kind[feature]), int(self.condition[feature])
        if kind == NONE:
            return ""
        if kind == CONTEXT:
            words = "fires on any token"
        else:
            names = [show(vocab[int(a)]) for a in self.atoms[feature] if a >= 0]
            words = f"{KIND_WORDS[kind]} {' / '.join(names)}"
        return f"{words} {conditions[cond]}" if cond else words


def show(token: str) -> str:
    """A token as a label quotes it: `"Paris"`, newlines escaped."""
    return '"' + token.replace("\n", "\\n") + '"'
