#!/usr/bin/env python
"""The circuit search before and after issue 54, on the same finished run and prompts.

* `before`: candidates ranked by attribution's patching score (what differs between clean and
  corrupted prompts), judged by the run's ablation, the smallest faithful prefix reported;
* `after`: ranked by each node's score against the run's ablation (interventions/
  ablation_scores.py), judged by the same ablation, the prefix pruned by measured effect
  (interventions/pruning.py), as the interventions stage now reports it.

For the features circuit (components, SAE features and error terms) and the components alone:
the circuit's size, its faithfulness on the held-out half, both rankings' held-out faithfulness
at every size both measured (`heldout_by_size`: n, before, after), and MIB's CPR (area under the
faithfulness curve, higher is better) and CMD (area between it and 1, lower is better) of the
ranking's top-n curve held out; also the ablated runs each search took. The two searches share
one cache of ablated runs, so `runs` counts what each added. Usage (after `snakemake` on the
embedded default):

    python benchmarks/circuit_search.py --results results \
        --out benchmarks/results/circuit_search.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml


def _row(search, circuit: str, n: int | None) -> dict:
    curves = search.curves
    if circuit == "pruned":
        row = search.row("pruned")
    else:
        rows = curves[(curves["circuit"] == "top") & (curves["n"] == n)]
        row = None if rows.empty else rows.iloc[0]
    if row is None:
        return {"size": None, "faithfulness_heldout": None, "faithfulness": None}
    return {
        "size": int(row["n"]),
        "faithfulness": round(float(row["faithfulness"]), 4),
        "faithfulness_heldout": round(float(row["faithfulness_heldout"]), 4),
    }


def compare(results: Path, behaviour: str) -> dict:
    from circuitflow.attribution.splice import load_saes
    from circuitflow.batching import selection_half
    from circuitflow.devices import precise_math
    from circuitflow.interventions import selection as sel
    from circuitflow.interventions.ablation import Intervener
    from circuitflow.interventions.ablation_scores import ablation_scores
    from circuitflow.interventions.config import InterventionsConfig
    from circuitflow.interventions.inputs import read_attribution
    from circuitflow.interventions.stats import Runs, seeds_for
    from circuitflow.model.load import load_for_analysis
    from circuitflow.perf import PassCounter
    from circuitflow.prompts import read_prompts

    config = yaml.safe_load((results / "provenance" / "config.resolved.yaml").read_text())
    cfg = InterventionsConfig.from_dict(config["interventions"])
    prompts = read_prompts(results / "prompts" / f"{behaviour}.parquet").reset_index(drop=True)
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    attr = read_attribution(results / "attribution" / behaviour)
    model = load_for_analysis(results / "model", config["device"])
    for p in model.parameters():
        p.requires_grad_(False)
    sae_dirs = sorted((results / "saes").glob("resid_post/layer_*"))
    saes = load_saes(sae_dirs, next(model.parameters()).device)
    bypass_bos = bool(config["capture"]["exclude_bos"])
    out: dict = {"behaviour": behaviour, "ablation": cfg.ablation, "prompts": len(prompts)}
    with precise_math():
        iv = Intervener(model, prompts, cfg.ablation, cfg.mean_reference, cfg.batch_size, saes,
                        bypass_bos, cfg.runs_per_pass, PassCounter())  # fmt: skip
        runs = Runs(iv, seeds_for(cfg, config["seed"]))
        half = selection_half(prompts)
        universe = sel.candidates(attr, saes, cfg, model.cfg, iv)
        components = [n for n in universe if n.kind not in ("feature", "error")]
        t0, n0 = time.process_time(), runs.n_runs
        scores = ablation_scores(runs, saes, half, cfg.circuit_scores, cfg.circuit_ig_steps,
                                 bypass_bos=bypass_bos)  # fmt: skip
        out["scores"] = {"runs": runs.n_runs - n0, "cpu_s": round(time.process_time() - t0, 1)}
        for name, nodes in (("features", universe), ("components", components)):
            if name == "features" and len(nodes) == len(components):
                continue
            entry = {"candidates": len(nodes)}
            held_out = {}
            for which, ranked in (("before", nodes), ("after", scores.ranked(nodes))):
                t0, n0 = time.process_time(), runs.n_runs
                s = sel.search(runs, ranked, cfg, config["seed"], half, "ablation", which)
                if which == "before":  # today's search: no pruning, the smallest prefix
                    row = _row(s, "top", s.smallest)
                else:
                    row = _row(s, "pruned", None) | {"prefix": s.smallest}
                entry[which] = row | {
                    "cpr": round(s.cpr, 4), "cmd": round(s.cmd, 4),
                    "runs": runs.n_runs - n0, "cpu_s": round(time.process_time() - t0, 1),
                }  # fmt: skip
                top = s.curves[s.curves["circuit"] == "top"].drop_duplicates("n")
                held_out[which] = dict(zip(top["n"], top["faithfulness_heldout"], strict=True))
            # Held-out faithfulness of both rankings at every size both curves measured.
            common = sorted(set(held_out["before"]) & set(held_out["after"]))
            entry["heldout_by_size"] = [
                [int(n), round(held_out["before"][n], 4), round(held_out["after"][n], 4)]
                for n in common
            ]
            entry["after_at_least_before_heldout"] = all(
                held_out["after"][n] >= held_out["before"][n] - 0.01 for n in common
            )
            out[name] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--behaviours", nargs="+", default=["induction", "facts"])
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    a = parser.parse_args()
    found = [compare(a.results, b) for b in a.behaviours]
    text = json.dumps({"command": "python benchmarks/circuit_search.py", "results": found},
                      indent=1)  # fmt: skip
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    for r in found:
        for name in ("features", "components"):
            if name in r:
                b, f = r[name]["before"], r[name]["after"]
                print(f"{r['behaviour']} {name}: size {b['size']} -> {f['size']}, held-out "
                      f"faithfulness {b['faithfulness_heldout']} -> {f['faithfulness_heldout']}, "
                      f"CPR {b['cpr']} -> {f['cpr']}, CMD {b['cmd']} -> {f['cmd']}")  # fmt: skip


if __name__ == "__main__":
    main()
