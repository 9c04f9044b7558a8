"""How well each label's rule predicts where its feature fires, counted over a stream of token
positions: the counts a rule is chosen by (on the contexts the labels are written from) and
scored by (on held-out contexts), and the scores.

A feature fires at a position where its activation is positive. A rule (features/rules.py)
predicts a set of positions; over the positions counted, `tp` is where it predicts and the
feature fires, `fp` where it predicts and the feature does not, `fn` where the feature fires
and it does not predict: precision tp / (tp + fp), recall tp / (tp + fn), F1 2 tp / (2 tp + fp
+ fn), each 0 where there is nothing to divide (as scikit-learn's zero_division=0).

**Counts per atom.** The tokens a rule names hold at disjoint positions, so a rule's counts are
sums over its atoms (rules.py). `AtomCounts` keeps, for a fixed set of slots (feature, kind,
token), how often the feature fires where the slot's token holds under each condition ([S, C])
and how often each feature fires under each condition ([F, C]); `PositionCounts`, shared by the
dictionaries read at the same positions, how often each token holds under each condition ([3,
C, vocab]) and how many positions meet each condition ([C]). An update reads only the firing
entries of the batch (nonzero of the activations, as the collector does) and the positions'
keys: O(nnz), counts kept per cell and summed into conditions at the end, no [positions,
features] table, no host synchronisation but nonzero's.

**Choosing** (`choose`): for each feature, every union of up to MAX_ATOMS of its candidate
tokens of one kind (the tokens at, before and after the positions its top and quantile contexts
were kept for) under each condition, and each condition alone (`fires on any token ...`):
among a kind's tokens under a condition, the best union of m tokens for F1 is the m of highest
precision (F1 of disjoint parts), so the search is a sort. A more complex rule (more tokens, a
condition) must beat a simpler one by `MIN_GAIN` of F1.

**Control** (`control_order`): each live feature scored with another live feature's rule (a
random cyclic shift of the live features, seeded), which says what F1 a label with no relation
to its feature gets from the base rates alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from circuitflow.features.rules import CONTEXT, KINDS, MAX_ATOMS, NONE, RuleTable, cell_conditions

__all__ = [
    "AtomCounts",
    "PositionCounts",
    "Scores",
    "Slots",
    "choose",
    "control_order",
    "score",
    "summarise",
]

MIN_GAIN = 0.01  # F1 a rule with one more token, or a condition, must gain over a simpler one
STRONG_F1 = 0.8  # a label at least this good is what summaries count as trustworthy
CHOOSE_BLOCK = 2048  # features whose candidates `choose` sorts at once (memory: ~60 MB a block)
# CANDIDATES (state.py): tokens of each kind a feature's rule may name, the most frequent at,
# before and after its kept contexts' positions; 8 chose rules within 0.004 of every such
# token's held-out mean F1 on the embedded default, at a third of the counts' memory.
DENSE_LOOKUP = 2**24  # (feature, kind, token) triples up to which a slot is found by a table


@dataclass(frozen=True)
class Slots:
    """Sorted unique (feature, kind, token) triples, coded `(feature * 3 + kind) * vocab +
    token` (int64, numpy)."""

    codes: np.ndarray
    vocab: int

    @classmethod
    def of(cls, feature, kind, token, vocab: int) -> Slots:
        feature, kind, token = (
            np.asarray(a, dtype=np.int64).ravel() for a in (feature, kind, token)
        )
        ok = (token >= 0) & np.isin(kind, KINDS)
        codes = (feature[ok] * len(KINDS) + kind[ok]) * vocab + token[ok]
        return cls(np.unique(codes), vocab)

    @classmethod
    def for_rules(cls, tables: list[RuleTable], vocab: int) -> Slots:
        """Every atom of every rule in `tables` (rule i of a table is feature i's)."""
        parts = []
        for t in tables:
            f = np.repeat(np.arange(len(t)), MAX_ATOMS)
            parts.append((f, np.repeat(t.kind, MAX_ATOMS), t.atoms.ravel()))
        return cls.of(*(np.concatenate(p) for p in zip(*parts, strict=True)), vocab)

    def __len__(self) -> int:
        return len(self.codes)

    @property
    def feature(self) -> np.ndarray:
        return self.codes // self.vocab // len(KINDS)

    @property
    def kind(self) -> np.ndarray:
        return self.codes // self.vocab % len(KINDS)

    @property
    def token(self) -> np.ndarray:
        return self.codes % self.vocab

    def index(self, feature, kind, token) -> np.ndarray:
        """The slot of each (feature, kind, token), -1 where there is none."""
        feature, kind, token = np.broadcast_arrays(feature, kind, token)
        code = (feature * len(KINDS) + kind) * self.vocab + token
        i = np.searchsorted(self.codes, code).clip(max=max(len(self.codes) - 1, 0))
        found = (len(self.codes) > 0) & (token >= 0) & np.isin(kind, KINDS)
        found &= self.codes[i] == code if len(self.codes) else False
        return np.where(found, i, -1)


class PositionCounts:
    """How many positions meet each (kind, token) and cell, over the positions fed to `update`,
    whatever the features (the predicted side of every rule): one table for a group of
    dictionaries read at the same positions, [3, vocab + 1, cells] (token vocab: none) and
    [cells], int64 on `device`."""

    def __init__(self, vocab: int, context_length: int, device="cpu"):
        self.vocab = vocab
        self.cell_conditions = cell_conditions(context_length)
        cells = self.n_cells = len(self.cell_conditions)
        dev = self.device = torch.device(device)
        self.holds = torch.zeros(len(KINDS) * (vocab + 1) * cells, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(cells, dtype=torch.int64, device=dev)

    @torch.no_grad()
    def update(self, keys: torch.Tensor, cells: torch.Tensor) -> None:
        """Add positions: `keys` [P, 3] and `cells` [P] (rules.position_keys)."""
        keys, cells = keys.to(self.device), cells.to(self.device)
        n, v = self.n_cells, self.vocab
        ones = torch.ones(len(cells), dtype=torch.int64, device=self.device)
        self.positions.index_add_(0, cells, ones)
        for k in KINDS:
            key = torch.where(keys[:, k] >= 0, keys[:, k], v)
            self.holds.index_add_(0, (k * (v + 1) + key) * n + cells, ones)

    @property
    def total(self) -> int:
        """Positions counted."""
        return int(self.positions.sum())

    def arrays(self) -> dict[str, np.ndarray]:
        """By condition, on the host: holds [3, C, vocab], positions [C]."""
        m = self.cell_conditions.astype(np.int64)  # [cells, C]
        holds = self.holds.view(len(KINDS), self.vocab + 1, self.n_cells)[:, : self.vocab]
        return {
            "holds": (holds.cpu().numpy() @ m).transpose(0, 2, 1),
            "positions": self.positions.cpu().numpy() @ m,
        }


class AtomCounts:
    """The counts (module docstring) of one dictionary's features over the positions fed to
    `update`, on the device of `where` (the group's PositionCounts of the same positions, fed
    by the caller), kept per cell (rules.n_cells: a position's range, whether its token is
    repeated, whether it sits in a repeated segment) so an update adds one count per firing
    entry and kind; `arrays` sums the cells into conditions."""

    def __init__(self, slots: Slots, n_features: int, where: PositionCounts):
        self.slots, self.n_features, self.where = slots, n_features, where
        self.n_conditions = where.cell_conditions.shape[1]
        cells = where.n_cells
        dev = self.device = where.device
        v = slots.vocab
        self.codes = torch.from_numpy(slots.codes).to(dev)
        # Where (feature, kind, token) codes fit a table, a slot is one gather away (`lookup`,
        # token v: none), else a binary search of the sorted codes.
        self.lookup = None
        if n_features * len(KINDS) * (v + 1) <= DENSE_LOOKUP:
            self.lookup = torch.full((n_features * len(KINDS) * (v + 1),), len(slots),
                                     dtype=torch.int64, device=dev)  # fmt: skip
            f, k, tok = (
                torch.from_numpy(a).to(dev) for a in (slots.feature, slots.kind, slots.token)
            )
            self.lookup[(f * len(KINDS) + k) * (v + 1) + tok] = torch.arange(len(slots), device=dev)
        # Flat counts, one row of `cells` each: slots (+1: the misses' row; int32, the largest
        # table, exact up to 2**31 positions) and features (int64).
        self.tp = torch.zeros((len(slots) + 1) * cells, dtype=torch.int32, device=dev)
        self.fires = torch.zeros(n_features * cells, dtype=torch.int64, device=dev)

    @torch.no_grad()
    def update(self, keys: torch.Tensor, cells: torch.Tensor, acts: torch.Tensor):
        """Add positions: `keys` [P, 3] and `cells` [P] (rules.position_keys), `acts` [P, F]
        the features' activations there. Returns the firing entries (position, feature)."""
        keys, cells = keys.to(self.device), cells.to(self.device)
        n, v, s = self.where.n_cells, self.slots.vocab, len(self.slots)
        pos, feat = torch.nonzero(acts.to(self.device) > 0, as_tuple=True)
        at = cells[pos]
        ones = torch.ones(len(pos), dtype=torch.int64, device=self.device)
        self.fires.index_add_(0, feat * n + at, ones)
        if not s:
            return pos, feat
        ones = ones.int()
        for k in KINDS:
            key = keys[pos, k]
            if self.lookup is not None:
                row = self.lookup[(feat * len(KINDS) + k) * (v + 1) + torch.where(key >= 0, key, v)]
            else:
                code = (feat * len(KINDS) + k) * v + key
                i = torch.searchsorted(self.codes, code).clamp(max=s - 1)
                row = torch.where((self.codes[i] == code) & (key >= 0), i, s)
            self.tp.index_add_(0, row * n + at, ones)
        return pos, feat

    def arrays(self) -> dict[str, np.ndarray]:
        """The counts by condition, on the host: tp [S, C], fires [F, C], and the positions'
        holds [3, C, vocab] and positions [C]."""
        m = self.where.cell_conditions.astype(np.int64)  # [cells, C]
        n = self.where.n_cells
        return {
            "tp": self.tp.view(-1, n)[:-1].cpu().numpy().astype(np.int64) @ m,
            "fires": self.fires.view(-1, n).cpu().numpy() @ m,
            **self.where.arrays(),
        }


# --- choosing -------------------------------------------------------------------------------------
def choose(counts: AtomCounts, min_gain: float = MIN_GAIN) -> tuple[RuleTable, np.ndarray]:
    """Each feature's rule of best F1 on the counted positions (module docstring), and that F1
    (NaN for a feature that never fired there: its rule is NONE)."""
    a = counts.arrays()
    slots, f_total, c = counts.slots, counts.n_features, counts.n_conditions
    table = RuleTable.empty(f_total)
    best_f1 = np.full(f_total, np.nan)
    group = slots.feature * len(KINDS) + slots.kind  # slots are sorted by it
    starts = np.searchsorted(group, np.arange(f_total * len(KINDS) + 1))
    width = int(np.diff(starts).max()) if len(slots) else 0
    for lo in range(0, f_total, CHOOSE_BLOCK):
        hi = min(lo + CHOOSE_BLOCK, f_total)
        _choose_block(a, slots, starts, width, lo, hi, c, min_gain, table, best_f1)
    return table, best_f1


def _choose_block(a, slots, starts, width, lo, hi, c, min_gain, table, best_f1) -> None:
    n = hi - lo
    ap = a["fires"][lo:hi, 0].astype(np.float64)  # [n]
    # Token rules: [n, kinds, width, C] counts of each candidate under each condition.
    tp = np.zeros((n, len(KINDS), max(width, 1), c))
    pp = np.zeros_like(tp)
    first, last = starts[lo * len(KINDS)], starts[hi * len(KINDS)]
    if last > first:
        s = np.arange(first, last)
        g = slots.feature[s] * len(KINDS) + slots.kind[s]
        rank = s - starts[g]
        fi, ki = slots.feature[s] - lo, slots.kind[s]
        tp[fi, ki, rank] = a["tp"][s]
        pp[fi, ki, rank] = a["holds"][ki, :, slots.token[s]]
    prec = np.where(pp > 0, tp / np.maximum(pp, 1), -1.0)
    order = np.argsort(-prec, axis=2, kind="stable")[:, :, :MAX_ATOMS]
    ctp = np.cumsum(np.take_along_axis(tp, order, 2), 2)
    cpp = np.cumsum(np.take_along_axis(pp, order, 2), 2)
    denom = cpp + ap[:, None, None, None]
    f1 = np.where(denom > 0, 2 * ctp / np.maximum(denom, 1), 0.0)  # [n, kinds, m, C]
    m = f1.shape[2]
    penalty = min_gain * (np.arange(m)[None, None, :, None] + (np.arange(c) > 0)[None, None, None])
    # Context rules: [n, C] (every condition but "every position" is a condition: one step).
    dctx = a["positions"][None, :] + ap[:, None]
    f1ctx = np.where(dctx > 0, 2 * a["fires"][lo:hi] / np.maximum(dctx, 1), 0.0)
    # Simpler first, so ties go to them: m atoms, then condition, then kind; context rules last.
    tok_score = (f1 - penalty).transpose(0, 2, 3, 1).reshape(n, -1)  # [n, m * C * kinds]
    ctx_score = f1ctx - min_gain
    score = np.concatenate([tok_score, ctx_score], 1)
    pick = score.argmax(1)
    raw = np.concatenate([f1.transpose(0, 2, 3, 1).reshape(n, -1), f1ctx], 1)
    for i in np.flatnonzero(ap > 0):
        j, f = int(pick[i]), lo + int(i)
        best_f1[f] = raw[i, j]
        if j >= m * c * len(KINDS):
            table.set(f, CONTEXT, j - m * c * len(KINDS))
            continue
        atoms_m, rest = divmod(j, c * len(KINDS))
        cond, kind = divmod(rest, len(KINDS))
        ranks = order[i, kind, : atoms_m + 1, cond]
        tokens = slots.token[starts[f * len(KINDS) + kind] + ranks]
        table.set(f, KINDS[kind], cond, tokens.tolist())


# --- scoring --------------------------------------------------------------------------------------
@dataclass
class Scores:
    """Per feature (numpy, F): the rule's counts over the positions scored and what they give;
    a ratio with nothing to divide is 0 (no evidence for the label: a rule that names no
    held-out token where its feature never fires there scores 0, not a vacuous 1)."""

    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray

    @staticmethod
    def _ratio(num, den) -> np.ndarray:
        num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
        return np.divide(num, den, out=np.zeros_like(den), where=den > 0)

    @property
    def precision(self) -> np.ndarray:
        return self._ratio(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> np.ndarray:
        return self._ratio(self.tp, self.tp + self.fn)

    @property
    def f1(self) -> np.ndarray:
        return self._ratio(2 * self.tp, 2 * self.tp + self.fp + self.fn)


def score(rules: RuleTable, counts: AtomCounts) -> Scores:
    """Each feature's rule (rules i is feature i's) counted on the positions `counts` saw; its
    slots must hold every atom of `rules` (Slots.for_rules)."""
    a = counts.arrays()
    f = np.arange(len(rules))
    ap = a["fires"][:, 0]
    tp = np.zeros(len(rules), dtype=np.int64)
    pp = np.zeros(len(rules), dtype=np.int64)
    tokens = np.isin(rules.kind, KINDS)
    for j in range(MAX_ATOMS):
        atom = rules.atoms[:, j]
        use = tokens & (atom >= 0)
        slot = counts.slots.index(f, rules.kind, atom)
        if (use & (slot < 0)).any():
            raise ValueError("score: the counts hold no slot for some rule's token")
        kind = np.where(use, rules.kind, 0)
        # Indexed where used only: a dead dictionary's counts hold no slot at all (size 0).
        tp[use] += a["tp"][slot[use], rules.condition[use]]
        pp += np.where(use, a["holds"][kind, rules.condition, np.where(use, atom, 0)], 0)
    ctx = rules.kind == CONTEXT
    tp = np.where(ctx, a["fires"][f, rules.condition], tp)
    pp = np.where(ctx, a["positions"][rules.condition], pp)
    none = rules.kind == NONE
    tp, pp = np.where(none, 0, tp), np.where(none, 0, pp)
    return Scores(tp=tp, fp=pp - tp, fn=ap - tp)


def control_order(live: np.ndarray, seed: int) -> np.ndarray:
    """A permutation of the features: each live one gets another live feature (a random cyclic
    shift of the live features, seeded), every other itself."""
    order = np.arange(len(live))
    idx = np.flatnonzero(live)
    if len(idx) > 1:
        shuffled = np.random.default_rng([seed, 48]).permutation(idx)
        order[shuffled] = np.roll(shuffled, 1)
    return order


def summarise(scores: Scores, live: np.ndarray, strong: float = STRONG_F1) -> dict:
    """Over the live features: how many were scored (F1 a number: all, but where an explainer
    left one without examples), their mean and median F1, the share at F1 >= `strong`, the
    median precision and recall, and a histogram of F1 (ten equal bins over [0, 1])."""
    f1 = scores.f1[live]
    scored = f1[~np.isnan(f1)]
    hist, _ = np.histogram(scored, bins=np.linspace(0, 1, 11))

    def stat(fn, values):
        values = values[~np.isnan(values)]
        return float(fn(values)) if len(values) else None

    return {
        "n_live": int(live.sum()),
        "n_scored": int(len(scored)),
        "mean_f1": stat(np.mean, f1),
        "median_f1": stat(np.median, f1),
        "share_f1_at_least_0.8": float((scored >= strong).mean()) if len(scored) else None,
        "median_precision": stat(np.median, scores.precision[live]),
        "median_recall": stat(np.median, scores.recall[live]),
        "f1_hist": hist.tolist(),
    }
