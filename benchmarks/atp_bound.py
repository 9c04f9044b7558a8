#!/usr/bin/env python
"""How close can attribution patching (`attribution.method: atp`) come to exact patching on a
finished run? Rank agreement (Spearman) with exact patching, on the nodes and validation
prompts the attribution stage patched exactly, of:

* `atp_plain`: g . (a_clean - a_corr), g = dm/da on the clean run (Nanda 2023);
* `atp`: the stage's, each node's direct effect exact (attribution/direct.py);
* `atp_qk_oracle`: an upper bound for AtP*'s QK fix (Kramar et al. 2024), which recomputes
  the attention softmax for each node's change to queries and keys. Here every attention
  pattern's change is exact, taken from a real forward with the node patched:
      g_frozen . (a_clean - a_corr) + sum over layers of dm/dA . (A_clean - A_patched),
  g_frozen the gradient with every pattern held constant;
* `atp_qk_oracle_direct`: the same with each node's direct effect exact, as the stage does.

Nodes that cannot move the metric (a pruned head: every method gives exactly 0) are left out,
as the stage's validation leaves them out. A method this side of the oracle (a QK fix,
GradDrop) ranks no better than the oracle does. The exact reference is recomputed here on the
same prompts, and printed next to the stage's `score_exact` as a check. Usage (after
`snakemake`, on the embedded default):

    python benchmarks/atp_bound.py --results results --behaviour induction
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch


def exact_rows(table: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The rows of heads.parquet or features.parquet the stage patched exactly."""
    rows = table[table["score_exact"].notna()]
    return rows[rows["kind"] == kind] if "kind" in rows else rows  # features hold errors too


def node_keys(table: pd.DataFrame, kind: str) -> list[tuple[str, int]]:
    """(group key, index) of the stage's exactly patched nodes of `kind` (head or feature)."""
    from circuitflow.nodes import head_hook, hook_name

    rows = exact_rows(table, kind)
    if kind == "head":
        return [(head_hook(int(r.layer)), int(r.head)) for r in rows.itertuples()]
    return [
        (hook_name(r.site, int(r.layer)) + ".sae:feats", int(r.feature)) for r in rows.itertuples()
    ]


def pattern_hooks(model, store: dict, frozen: bool):
    """Forward hooks on every layer's attention pattern: record it (as a fresh leaf when
    `frozen`, so gradients through it stop there and its own gradient can be read)."""

    def hook(layer: int):
        def fn(pattern: torch.Tensor, hook) -> torch.Tensor:
            if frozen:
                pattern = pattern.detach().requires_grad_(True)
            store[layer] = pattern
            return pattern

        return fn

    return [
        (f"blocks.{layer}.attn.hook_pattern", hook(layer)) for layer in range(model.cfg.n_layers)
    ]


def per_node(values: torch.Tensor, index: int) -> torch.Tensor:
    """One head's or feature's per-prompt values out of reduce_nodes' [b, n_nodes] table."""
    return values[:, index]


@torch.no_grad()  # atp_batch and the oracle's gradient turn it back on where they need it
def measure(results: Path, behaviour: str, batch_size: int) -> dict:
    from circuitflow.attribution import direct
    from circuitflow.attribution import scores as attr
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.attribution.methods.atp import atp_batch
    from circuitflow.attribution.splice import (
        Spliced,
        iter_batches,
        load_saes,
        logit_diff,
        reduce_nodes,
    )
    from circuitflow.model.load import load_model

    out_dir = results / "attribution" / behaviour
    summary = json.loads((out_dir / "summary.json").read_text())
    model = load_model(results / "model", "cpu", "float32")
    for p in model.parameters():
        p.requires_grad_(False)
    saes = load_saes(sorted((results / "saes").glob("*/layer_*")), "cpu")
    sp = Spliced.of(model, saes, bool(summary.get("bypass_bos", False)))
    cfg = AttributionConfig(validation_prompts=int(summary["n_validation_prompts"]))
    prompts = attr.validation_prompts(
        pd.read_parquet(results / "prompts" / f"{behaviour}.parquet"), cfg
    )
    tables = {
        "head": pd.read_parquet(out_dir / "heads.parquet"),
        "feature": pd.read_parquet(out_dir / "features.parquet"),
    }
    nodes = {kind: node_keys(t, kind) for kind, t in tables.items()}
    every = [n for kind in nodes for n in nodes[kind]]
    group_of = sp.group_of
    names = ("exact", "atp_plain", "atp", "atp_qk_oracle", "atp_qk_oracle_direct")
    sums = {name: dict.fromkeys(every, 0.0) for name in names}
    n = 0
    for batch in iter_batches(prompts, batch_size, "cpu"):
        corr = sp.acts(batch.corrupted)
        plain, metric, clean, _ = atp_batch(sp, batch, corr, exact_direct=False)
        # The gradient with every attention pattern held constant, and each pattern's own. The
        # final residual lies after every pattern: its value and gradient are the clean run's,
        # so they also give the stage's atp (plain AtP, direct effects exact) without its pass.
        clean_a: dict[int, torch.Tensor] = {}
        with torch.enable_grad(), model.hooks(fwd_hooks=pattern_hooks(model, clean_a, frozen=True)):
            run = sp.run(batch.clean)
            m = logit_diff(run.logits, batch.answer, batch.distractor)
            keys = list(run.acts)
            layers = sorted(clean_a)
            inputs = [run.acts[k] for k in keys] + [clean_a[i] for i in layers] + [run.final]
            grads = sp.grad(m.sum(), inputs, len(m), allow_unused=True)
        g_nodes, g_a, g_final = grads[: len(keys)], grads[len(keys) : -1], grads[-1]
        frozen = {
            k: reduce_nodes(
                k, group_of[k], ((g if g is not None else 0) * (clean[k] - corr[k])).float()
            )
            for k, g in zip(keys, g_nodes, strict=True)
        }
        final = run.final.detach()
        stage = direct.with_exact_direct(sp, batch, plain, clean, corr, final, g_final)
        frozen_direct = direct.with_exact_direct(sp, batch, frozen, clean, corr, final, g_final)
        for key, index in every:
            patched_a: dict[int, torch.Tensor] = {}
            with model.hooks(fwd_hooks=pattern_hooks(model, patched_a, frozen=False)):
                patched = sp.run(
                    batch.clean, {key: attr.node_patch(key, group_of[key], index, corr[key])}
                )
            moved = logit_diff(patched.logits, batch.answer, batch.distractor)
            qk = sum(
                (g * (clean_a[i].detach() - patched_a[i])).flatten(1).sum(1)
                for i, g in zip(layers, g_a, strict=True)
                if g is not None
            )
            values = {
                "exact": metric - moved,
                "atp_plain": per_node(plain[key], index),
                "atp": per_node(stage[key], index),
                "atp_qk_oracle": per_node(frozen[key], index) + qk,
                "atp_qk_oracle_direct": per_node(frozen_direct[key], index) + qk,
            }
            for name, v in values.items():
                sums[name][(key, index)] += float(v.double().sum())
        n += len(batch.rows)
    means = {name: np.array([sums[name][node] / n for node in every]) for name in names}
    stage_exact = np.concatenate(
        [exact_rows(tables[kind], kind)["score_exact"].to_numpy() for kind in nodes]
    )
    kinds = np.array([kind for kind in nodes for _ in nodes[kind]])
    # Nodes that cannot move the metric (pruned heads): every method and exact patching give
    # exactly 0; left out as the stage's validation leaves them out (scores.inert).
    still = np.logical_and.reduce([attr.inert(means[name], means["exact"]) for name in names[1:]])
    report = {
        "results": str(results),
        "behaviour": behaviour,
        "n_prompts": n,
        "exact_matches_stage": float(np.abs(means["exact"] - stage_exact).max()),
        "spearman": {},
    }
    for kind in nodes:
        mask = (kinds == kind) & ~still
        report["spearman"][kind] = {
            "n_nodes": int(mask.sum()),
            **{
                name: attr.spearman(means[name][mask], means["exact"][mask])
                for name in names
                if name != "exact"
            },
        }
    return report


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--results", type=Path, default=Path("results"), help="a finished run's results directory"
    )
    ap.add_argument("--behaviour", default="induction")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    report = measure(args.results, args.behaviour, args.batch_size)
    print(f"{args.behaviour}: Spearman against exact patching on {report['n_prompts']} prompts")
    names = [k for k in next(iter(report["spearman"].values())) if k != "n_nodes"]
    print(f"{'kind':10s} {'nodes':>5s} " + " ".join(f"{name:>20s}" for name in names))
    for kind, row in report["spearman"].items():
        cells = " ".join(
            f"{row[name]:20.3f}" if row[name] is not None else f"{'n/a':>20s}" for name in names
        )
        print(f"{kind:10s} {row['n_nodes']:5d} {cells}")
    gap = report["exact_matches_stage"]
    print(f"exact recomputed here vs the stage's score_exact: max |difference| {gap:.2e}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
