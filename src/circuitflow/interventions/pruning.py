"""Pruning by measured effect: from a faithful circuit, remove every node the circuit does not
need, greedily and ACDC-style (Conmy et al. 2023), judged by faithfulness on the selection half.

A node is removed when the circuit without it stays at the faithfulness threshold on the
selection half, measured exactly as circuits.circuit_curves measures it (mean over seeds, each a
bootstrap resample of the half; every node outside the circuit ablated). Candidates are tried
least important first (the reverse of their ranking). Batched: `batch` single removals are
measured in one batch of ablated runs (stats.Runs stacks them `runs_per_pass` to a forward
pass); those that pass are then removed together when the circuit still passes without all of
them, else the group is split in halves and each half tried again against the circuit as it
then is. Rounds repeat until one removes nothing (or `max_rounds`): at the end every node left
was tested against the final circuit, and its removal takes the circuit below the threshold.
A node whose removal changes nothing (all-zero weights, a decoy whose write nothing reads) can
therefore never stay in a circuit that passes with it.

Cost: each measurement is one ablated run a seed (one for zero and mean ablation), each a
forward pass of every prompt; a round measures each of its n nodes once alone, and k that pass
in at most 2k - 1 groups, so a round costs at most 3n runs a seed; with the start, the empty
circuit and the final check of each node left, `bound_runs` bounds the whole (`runs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from circuitflow.interventions.stats import Runs, bootstrap_rows
from circuitflow.nodes import Node


@dataclass
class Pruned:
    """The pruned circuit, and what it cost."""

    nodes: list[Node]  # the minimal faithful circuit, in the start's (ranked) order
    start: list[Node]  # the circuit pruning started from
    faithfulness: float  # selection half, as circuit_curves measures it
    threshold: float
    # Per node left, the selection half's faithfulness with it removed (each below threshold).
    necessity: dict[str, float] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)  # node ids, in the order removed
    rounds: int = 0
    converged: bool = False  # a round removed nothing: every node left was tested at the end
    runs: int = 0  # ablated runs spent (each a forward pass of every prompt)
    skipped: bool = False  # the start had more than max_nodes nodes: returned unpruned
    bound_runs: int = 0  # the bound on them: (3 max_rounds + 1) n + 2 runs a seed drawn


class Judge:
    """Faithfulness of circuits on prompt rows `rows`, as circuit_curves measures it: mean over
    `runs.seeds` of (m(C) - m(empty)) / (m(M) - m(empty)) on each seed's bootstrap resample of
    the rows, every node of `universe` outside C ablated."""

    def __init__(self, runs: Runs, universe: list[Node], rows: np.ndarray):
        self.runs, self.rows = runs, rows
        self.everything = frozenset(universe)

    def ablated(self, circuit) -> frozenset:
        return self.everything - frozenset(circuit)

    def queue(self, circuits) -> None:
        """Run every circuit's ablation not cached yet, batched."""
        sets = [self.everything, *(self.ablated(c) for c in circuits)]
        self.runs.prefetch(sets)

    def __call__(self, circuit) -> float:
        values = []
        for seed in self.runs.seeds:
            idx = self.rows[bootstrap_rows(len(self.rows), seed)]
            m_full = self.runs.base.logit_diff[idx].mean()
            m_empty = self.runs.get(self.everything, seed).logit_diff[idx].mean()
            m_c = self.runs.get(self.ablated(circuit), seed).logit_diff[idx].mean()
            den = m_full - m_empty
            values.append((m_c - m_empty) / den if den != 0 else np.nan)
        return float(np.mean(values))


def prune(
    runs: Runs,
    universe: list[Node],
    start: list[Node],
    selection: np.ndarray,
    threshold: float,
    batch: int = 16,
    max_rounds: int = 4,
    max_nodes: int | None = None,
) -> Pruned:
    """Prune `start` (ranked, most important first; a circuit faithful on the selection half)
    within the candidates `universe` (see the module). ValueError when `start` is not
    faithful: pruning keeps a circuit at the threshold, it cannot make one. A start of more
    than `max_nodes` nodes comes back unpruned (`skipped`), so the cost stays bounded by
    max_nodes whatever the candidates."""
    judge = Judge(runs, universe, np.flatnonzero(selection))
    n_runs = runs.n_runs
    circuit = list(start)
    judge.queue([circuit])
    faith = judge(circuit)
    if not faith >= threshold:
        raise ValueError(f"pruning starts from a faithful circuit: {faith:.3f} < {threshold}")
    out = Pruned(circuit, list(start), faith, threshold)
    if max_nodes is not None and len(start) > max_nodes:
        out.skipped, out.runs = True, runs.n_runs - n_runs
        return out
    per_set = len(runs.seeds) if runs.iv.kind == "resample" else 1  # stats.Runs caches
    out.bound_runs = ((3 * max_rounds + 1) * len(start) + 2) * per_set

    def without(nodes) -> list[Node]:
        drop = set(nodes)
        return [n for n in circuit if n not in drop]

    def remove_group(group: list[Node]) -> None:
        """Remove `group` together if the circuit passes without it, else each half."""
        nonlocal circuit
        if not group:
            return
        trial = without(group)
        judge.queue([trial])
        if judge(trial) >= threshold:
            circuit = trial
            out.removed += [n.id for n in group]
        elif len(group) > 1:
            half = len(group) // 2
            remove_group(group[:half])
            remove_group(group[half:])

    while out.rounds < max_rounds:
        out.rounds += 1
        before = len(circuit)
        pending = list(reversed(circuit))  # least important first
        for at in range(0, len(pending), batch):
            chunk = [n for n in pending[at : at + batch] if n in circuit]
            judge.queue([without([n]) for n in chunk])
            passing = [n for n in chunk if judge(without([n])) >= threshold]
            remove_group(passing)
        if len(circuit) == before:
            out.converged = True
            break
    judge.queue([without([n]) for n in circuit])
    out.necessity = {n.id: judge(without([n])) for n in circuit}
    out.nodes, out.faithfulness = circuit, judge(circuit)
    out.runs = runs.n_runs - n_runs
    return out
