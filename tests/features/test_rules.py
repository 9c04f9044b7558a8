"""The label rules and their counts against plain Python: each position's keys and conditions,
each rule's tp / fp / fn counted token by token, the choice of a planted rule, the control's
permutation and the text a label is shown with."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitflow.features import labels, rules, scores
from circuitflow.features.rules import CONTEXT, CUR, NEXT, NONE, PREV, RuleTable

T, V, FIRST = 16, 9, 1


def plain_conditions(ctx: list[int], j: int) -> list[bool]:
    """The conditions of rules.condition_names(T) at position j of context ctx, by hand."""
    repeated = ctx[j] in ctx[:j]
    bigrams = {(ctx[i - 1], ctx[i]) for i in range(1, j)}
    segment = j > 0 and (ctx[j - 1], ctx[j]) in bigrams
    out = [True, repeated, not repeated, segment, not segment]
    for q in rules.position_thresholds(len(ctx)):
        out += [j <= q, j > q]
    return out


def plain_holds(rule: tuple, ctx: list[int], j: int) -> bool:
    """Whether (kind, condition, atoms) names position j of ctx, by hand."""
    kind, cond, atoms = rule
    if kind == NONE or not plain_conditions(ctx, j)[cond]:
        return False
    if kind == CONTEXT:
        return True
    at = {CUR: j, PREV: j - 1, NEXT: j + 1}[kind]
    return 0 <= at < len(ctx) and ctx[at] in atoms


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, size=(12, T))
    tokens[:, 0] = 0
    tokens[3, 8:] = tokens[3, 2:10]  # a repeated segment
    acts = rng.random((12, T - FIRST, 5)) * (rng.random((12, T - FIRST, 5)) < 0.3)
    return tokens, acts.astype(np.float32)


def test_keys_and_cells_match_a_plain_reading(data):
    tokens, _ = data
    keys, cells = rules.position_keys(torch.from_numpy(tokens), FIRST)
    member = rules.cell_conditions(T)
    p = 0
    for ctx in tokens.tolist():
        for j in range(FIRST, T):
            want = [ctx[j], ctx[j - 1] if j else -1, ctx[j + 1] if j + 1 < T else -1]
            assert keys[p].tolist() == want
            assert member[int(cells[p])].tolist() == plain_conditions(ctx, j)
            p += 1


@pytest.mark.parametrize("dense", [True, False])  # slots found by table, or binary search
def test_rule_counts_match_a_plain_count(data, monkeypatch, dense):
    if not dense:
        monkeypatch.setattr(scores, "DENSE_LOOKUP", 0)
    tokens, acts = data
    f = acts.shape[-1]
    table = RuleTable.empty(f)
    table.set(0, CUR, 0, [1, 2])
    table.set(1, PREV, 1, [3])  # after 3, token repeated
    table.set(2, NEXT, 3, [4, 5, 6])  # before 4, 5 or 6, in a repeated segment
    table.set(3, CONTEXT, 6)  # any token above the first position threshold
    control = table.take(scores.control_order(np.array([1, 1, 1, 1, 0], bool), 0))
    where = scores.PositionCounts(V, T)
    counts = scores.AtomCounts(scores.Slots.for_rules([table, control], V), f, where)
    keys, cells = rules.position_keys(torch.from_numpy(tokens), FIRST)
    for lo in range(0, len(tokens), 5):  # in batches, as the stage feeds them
        sl = slice(lo * (T - FIRST), (lo + 5) * (T - FIRST))
        where.update(keys[sl], cells[sl])
        counts.update(keys[sl], cells[sl], torch.from_numpy(acts[lo : lo + 5].reshape(-1, f)))
    for t in (table, control):
        got = scores.score(t, counts)
        for feat in range(f):
            rule = (
                int(t.kind[feat]),
                int(t.condition[feat]),
                set(t.atoms[feat][t.atoms[feat] >= 0]),
            )
            tp = fp = fn = 0
            for c, ctx in enumerate(tokens.tolist()):
                for j in range(FIRST, T):
                    said, fires = plain_holds(rule, ctx, j), acts[c, j - FIRST, feat] > 0
                    tp, fp, fn = (
                        tp + (said and fires),
                        fp + (said and not fires),
                        fn + (fires and not said),
                    )
            assert (got.tp[feat], got.fp[feat], got.fn[feat]) == (tp, fp, fn), (feat, rule)


def test_choose_finds_a_planted_rule():
    """A feature that fires exactly before token 5 where the token is repeated, another on
    tokens 1 or 2: chosen with F1 1 from their kept positions' tokens."""
    rng = np.random.default_rng(2)
    tokens = rng.integers(1, V, size=(200, T))
    tokens[:, 0] = 0
    keys, cells = rules.position_keys(torch.from_numpy(tokens), FIRST)
    fire = np.zeros((len(keys), 2), np.float32)
    member = rules.cell_conditions(T)
    repeated = member[cells.numpy(), 1]
    fire[:, 0] = (keys[:, 2].numpy() == 5) & repeated
    fire[:, 1] = np.isin(keys[:, 0].numpy(), [1, 2])
    kept = [np.flatnonzero(fire[:, i])[:40] for i in range(2)]
    slots = scores.Slots.of(
        np.concatenate([np.full(3 * len(k), i) for i, k in enumerate(kept)]),
        np.concatenate([np.repeat([0, 1, 2], len(k)) for k in kept]),
        np.concatenate([keys[k].numpy().T.ravel() for k in kept]), V,
    )  # fmt: skip
    where = scores.PositionCounts(V, T)
    where.update(keys, cells)
    counts = scores.AtomCounts(slots, 2, where)
    counts.update(keys, cells, torch.from_numpy(fire))
    table, f1 = scores.choose(counts)
    names = rules.condition_names(T)
    vocab = [f"w{i}" for i in range(V)]
    assert table.text(0, vocab, names) == 'fires before "w5" when repeated in its context'
    assert table.text(1, vocab, names) == 'fires on "w1" / "w2"'
    np.testing.assert_allclose(f1, [1.0, 1.0])


def test_control_is_a_derangement_of_the_live_features():
    live = np.array([1, 0, 1, 1, 0, 1, 1], bool)
    order = scores.control_order(live, 5)
    assert sorted(order[live]) == sorted(np.flatnonzero(live))
    assert (order[live] != np.flatnonzero(live)).all()
    assert (order[~live] == np.flatnonzero(~live)).all()


def test_shown_text_says_how_far_to_trust_a_label():
    assert labels.shown('fires on "a"', 0.912) == 'fires on "a" (F1 0.91)'
    assert labels.shown('fires on "a"', 0.21) == 'weak (F1 0.21): fires on "a"'
    assert labels.shown('fires on "a"', float("nan")) == 'fires on "a" (unscored)'
    assert labels.shown("dead", 0.0) == "dead"
