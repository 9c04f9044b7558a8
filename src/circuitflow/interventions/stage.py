"""The interventions stage: test what attribution claims by changing the model and measuring
the behaviour.

Metric m: mean logit difference (answer - distractor, last position) over the behaviour's clean
prompts. M is the unmodified model; ablations use one kind (`zero`, `mean`, `resample`, see
`ablation.py`), recorded in every table and in summary.json.

* Circuits. Candidate nodes (`circuit_nodes: features`, the default) are the components
  (token embedding, every head, every MLP), every SAE feature that fires on the behaviour's
  clean prompts and every SAE's error term, as in Marks et al. 2024: the SAEs make the residual
  stream itself a set of nodes, so a circuit can keep the token- and concept-specific directions
  that carry the behaviour and drop the rest. `components` uses the components only. Nodes are
  ranked by |ablation score| (ablation_scores.py: each node's score against the run's ablation,
  the counterfactual the circuit is judged by; attribution's scores are against the corrupted
  prompt). C_n = the top n nodes, and for each n:
  faithfulness(n) = (m(C_n) - m(empty)) / (m(M) - m(empty)) with every node outside C_n ablated;
  completeness(n) = (m(M) - m(M minus C_n)) / (m(M) - m(empty)) with C_n ablated and the rest
  kept: the share of the model's effect that is lost without the circuit (1 = nothing outside
  the circuit can do the task; it is 1 - the complement's faithfulness of Marks et al. 2024).
  Control: at each n, random circuits of n nodes (`n_random_circuits` draws). The smallest
  faithful n is found on the grid of sizes and then by bisection between the last unfaithful
  and the first faithful grid size. The attribution graph's own node set is scored as well.
  Beside a circuit of features, the same search over the components alone gives the component
  circuit (component_circuits.parquet, summary.json's `component_circuit`): components are
  shared by every prompt, while residual features are token-specific and a circuit of them can
  overfit its selection prompts, so the report leads with the component circuit's held-out
  faithfulness.
  Two views of the circuit, each pruned to a minimal faithful circuit (pruning.py) and held out
  (circuit_views.parquet, summary.json's `ablation_circuit` and `patching_circuit`, with MIB's
  CPR and CMD): what the behaviour needs (ranked by ablation score, judged by the ablation) and
  what carries the difference (ranked by attribution, judged by patching from the corrupted
  prompt).
* Heads. Every head alone; every pair and triplet (up to `max_set_size`) among the top-k heads by
  attribution, with the additive prediction (sum of single effects) and the interaction, and
  random head sets of each size as the control. A head is inert when its own ablation has no
  effect (its t-interval covers 0); it carries no difference when its attribution score
  against the corrupted prompt is exactly 0 (it may still be needed). Heads that are both
  (such as the embedded model's pruned heads) are left out of the top heads: sets of them
  only repeated the sets without them.
* Features. The top features by attribution, ablated, next to random active features of the same
  SAE; and steered: alpha * W_dec[f] added at the feature's site, next to a random direction of
  the same norm, with the top tokens whose mean logit rises most.

Statistics: effects are m(M) - m(ablated) (`score`, positive = the node supports the answer, as
in attribution), as a share of m(M) (`drop_frac`), the change in accuracy (answer beats
distractor) and in calibration error. Each is repeated over `n_seeds` seeds, each a bootstrap
resample of the prompts (and, for resample ablation, a new draw of the corrupted prompts):
columns `<x>` hold the mean across seeds, `<x>_std` the std; `score_ci_low/high` is a
t-interval over prompts on the full set, `p_value` a paired t-test against no effect.

Flags (flags.py): summary.json says where a random control reaches its circuit's value and
where a faithfulness falls under the threshold (held out, or the attribution graph's own).

Steps: `inputs.read_attribution` (the attribution stage's tables and graph),
`selection.circuits` and `selection.top_heads` (what is tested), the studies `circuits`, `heads`
and `features` (each in its module), `write` (tables, figures) and `summary.summarise`
(summary.json, last; `summary.headline` is the script's line). `across.py` joins the behaviours'
single-head tables (rule interventions_across).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow.batching import selection_half
from circuitflow.interventions import features as feat
from circuitflow.interventions import heads as hd
from circuitflow.interventions import plots
from circuitflow.interventions.ablation import Intervener
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.inputs import read_attribution
from circuitflow.interventions.selection import (
    circuits,
    inert_heads,
    no_difference_heads,
    top_heads,
    untestable_heads,
)
from circuitflow.interventions.stats import Runs, seeds_for
from circuitflow.interventions.summary import summarise
from circuitflow.io import save_figure, write_json, write_parquet
from circuitflow.perf import PassCounter

log = logging.getLogger(__name__)


def write(
    out: Path, tables: dict[str, pd.DataFrame], cfg: InterventionsConfig, model_cfg, behaviour: str
) -> None:
    for frame in tables.values():
        frame.insert(0, "ablation", cfg.ablation)
    for name, frame in tables.items():
        write_parquet(out / f"{name}.parquet", frame)
    title = f"{behaviour} ({cfg.ablation} ablation)"
    figures = {
        "faithfulness.png": plots.circuit_curves(
            tables["circuits"], cfg.faithfulness_threshold, title
        ),
        "heads.png": plots.head_heatmap(
            tables["heads"], model_cfg.n_layers, model_cfg.n_heads, title
        ),
        "head_sets.png": plots.head_sets(tables["head_sets"], title),
        "steering.png": plots.steering(tables["steering"], title),
    }
    for name, fig in figures.items():
        save_figure(out / name, fig)


def intervene(
    model,
    prompts: pd.DataFrame,
    attribution_dir: Path | str,
    saes: dict[str, Any],
    tokenizer: Any,
    cfg: InterventionsConfig,
    behaviour: str,
    out_dir: Path | str,
    base_seed: int = 0,
    bypass_bos: bool = False,
) -> dict[str, Any]:
    """Write circuits.parquet, component_circuits.parquet, heads.parquet, head_sets.parquet,
    features.parquet, steering.parquet, the figures and summary.json (last) into `out_dir`.
    `bypass_bos`: the SAEs were trained without BOS, so they are bypassed there (as in
    attribution)."""
    t0 = time.perf_counter()
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.max_prompts:
        prompts = prompts.iloc[: cfg.max_prompts]
    prompts = prompts.reset_index(drop=True)
    attr = read_attribution(attribution_dir)
    counter = PassCounter()
    iv = Intervener(
        model,
        prompts,
        cfg.ablation,
        cfg.mean_reference,
        cfg.batch_size,
        saes,
        bypass_bos,
        cfg.runs_per_pass,
        counter,
    )
    with counter.part("circuits"):
        runs = Runs(iv, seeds_for(cfg, base_seed))
        c = circuits(runs, attr, saes, cfg, model.cfg, base_seed, selection_half(prompts))
    t_circuits = time.perf_counter() - t0
    with counter.part("heads"):
        singles = hd.single_heads(runs, model.cfg, attr.heads, cfg.ci_level)
        top = top_heads(attr, singles, cfg.top_k_heads)
        sets = hd.head_sets(runs, singles, top, cfg, model.cfg, base_seed)
    t_heads = time.perf_counter() - t0 - t_circuits
    with counter.part("features"):
        ablated, steering = feat.feature_interventions(
            runs, attr.features, saes, tokenizer, cfg, base_seed
        )
    t_total = time.perf_counter() - t0
    seconds = {
        "circuits": t_circuits,
        "heads": t_heads,
        "features": t_total - t_circuits - t_heads,
        "total": t_total,
    }

    tables = {
        "circuits": c.curves,
        "component_circuits": c.component_curves,
        "ablation_scores": c.views.scores.frame.drop(columns=["key", "order"]),
        "circuit_views": pd.concat(
            [
                v.curves.assign(view=v.view, judged_by=v.judged_by, candidates=name)
                for name, views in (("configured", c.views), ("components", c.component_views))
                if views is not None
                for v in (views.ablation, views.patching)
                if v is not None
            ],
            ignore_index=True,
        ),  # fmt: skip
        "heads": singles,
        "head_sets": sets,
        "features": ablated,
        "steering": steering,
    }
    out = Path(out_dir)
    write(out, tables, cfg, model.cfg, behaviour)
    heads = {
        "inert": inert_heads(singles),
        "no_difference": no_difference_heads(attr),
        "left_out": untestable_heads(attr, singles),
    }
    summary = summarise(behaviour, cfg, runs, c, singles, top, len(prompts), seconds, heads)
    summary |= counter.summary(len(prompts))
    write_json(out / "summary.json", summary)  # last: the rule's main output
    log.info(
        "%s: at n=%s faithfulness %s (held out %s), completeness %s; %d runs, %.1f s",
        behaviour,
        c.size,
        summary["faithfulness"],
        summary["faithfulness_heldout"],
        summary["completeness"],
        runs.n_runs,
        t_total,
    )
    return summary


def run(
    config: dict,
    behaviour: str,
    prompts_path: Path | str,
    model_json: Path | str,
    attribution_dir: Path | str,
    sae_dirs: list[Path | str],
    out_dir: Path | str,
) -> dict[str, Any]:
    """The stage: load the model, prompts and SAEs named by the rule, then `intervene`."""
    from circuitflow.attribution.splice import load_saes
    from circuitflow.devices import precise_math
    from circuitflow.model.load import load_for_analysis, load_tokenizer
    from circuitflow.prompts import read_prompts
    from circuitflow.sae.files import check_sae_dir

    cfg = InterventionsConfig.from_dict(config["interventions"])
    prompts = read_prompts(prompts_path)
    # Every input checked before the model is loaded.
    graph = read_attribution(attribution_dir, required=True).graph
    for d in sae_dirs:  # before the model: a damaged SAE is refused in a second
        check_sae_dir(d)
    model_dir = Path(model_json).parent
    model = load_for_analysis(model_dir, config["device"])
    saes = load_saes(sae_dirs, next(model.parameters()).device)
    # As attribution spliced the SAEs (it read how they were trained from the activations).
    with precise_math():
        return intervene(
            model,
            prompts,
            attribution_dir,
            saes,
            load_tokenizer(model_dir),
            cfg,
            behaviour,
            out_dir,
            int(config["seed"]),
            bool(graph.get("bypass_bos", False)),
        )
