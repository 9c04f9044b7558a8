"""The interventions stage's job plan (rule interventions): an upper bound on its passes, and
the job's host memory and counted work for circuitflow.resources (the rule table)."""

from __future__ import annotations

import math

from circuitflow.attribution.plan import estimate_attribution
from circuitflow.description import Run, describe
from circuitflow.interventions.config import EXACT_FEATURES
from circuitflow.memory import estimate_forward, load_bytes, model_dtype_name
from circuitflow.model.flops import attribution_forward_flops_per_prompt
from circuitflow.perf import Work


def passes(model_cfg, n_saes: int, d_sae: int, icfg) -> dict[str, float]:
    """Forward-pass equivalents per prompt of the interventions stage, an upper bound by part
    (the parts its PassCounter names: circuits, pruning, heads, features), read off
    interventions/: every ablated run is one forward
    pass of every prompt. Zero and mean ablations serve every seed from one run; resample
    ablation runs each seed. The circuit candidates are bounded by every component, every SAE
    feature and error term (the stage takes the features that fire), so the grid of circuit
    sizes and the bisection are bounds too; with features as candidates, the component
    circuit's search over the components alone is charged too. `icfg` is an
    InterventionsConfig."""
    layers, heads = model_cfg.n_layers, model_cfg.n_heads
    seeds = icfg.n_seeds if icfg.ablation == "resample" else 1
    random = icfg.n_random_circuits
    components = 1 + layers * heads + layers

    def search(candidates: int) -> tuple[int, int]:
        """(grid sizes, bisection steps) of a circuit search over `candidates` nodes."""
        if icfg.circuit_sizes is not None:
            grid = len(set(icfg.circuit_sizes)) + 1
        else:
            grid = candidates + 1 if candidates <= 64 else 24 + 3
        return grid, math.ceil(math.log2(max(candidates, 2)))

    grid, bisection = search(components + n_saes * (d_sae + 1))
    # The clean run, the mean reference, each SAE's features on the clean prompts; per size the
    # circuit and its complement (seed-averaged) and every random draw's pair; the graph's pair;
    # the bisection's pairs and the random draws at the size it finds; everything ablated.
    circuits = 2.0 + n_saes + seeds * (2 * grid + 2 + 2 * bisection + 1) + 2 * random * (grid + 1)
    if n_saes and icfg.circuit_nodes == "features":
        # The component circuit beside it: the same search over the components alone, its
        # random controls at the size it finds only.
        grid, bisection = search(components)
        circuits += seeds * (2 * grid + 2 * bisection + 1) + 2 * random
    # The circuits' two views (selection.circuits): the scores against the run's ablation (a
    # forward for the shapes and the method's passes, per seed drawn; a forward a hook for the
    # references; each node but the SAE features ablated alone), then each view's search
    # (grid, bisection: the ablation view's are the curves' above again, cached, but bounded
    # here all the same) and the patching view's clean run; their pruning is its own part
    # (pruning.Pruned.bound_runs, the prefix bounded by every candidate and prune_max_nodes:
    # its worst case, 3 runs a node a round, charged in full).
    method = 4.0 if icfg.circuit_scores == "atp" else 2.0 + 3.0 * icfg.circuit_ig_steps
    hooks = 1 + 2 * layers + n_saes
    exact = components + n_saes + (EXACT_FEATURES if n_saes else 0)
    circuits += seeds * method + hooks + seeds * exact

    def views(candidates: int) -> tuple[float, float]:
        """Both views' searches over `candidates` and the patching clean run; their pruning."""
        grid, bisection = search(candidates)
        pruning = (3 * icfg.prune_rounds + 1) * min(candidates, icfg.prune_max_nodes) + 2
        return 1 + 2 * seeds * (2 * grid + 2 * bisection + 1), 2 * seeds * pruning

    searched, pruned = views(components + n_saes * (d_sae + 1))
    if n_saes and icfg.circuit_nodes == "features":
        more = views(components)  # the same over the components alone
        searched, pruned = searched + more[0], pruned + more[1]
    sets = sum(math.comb(icfg.top_k_heads, k) + icfg.n_random_sets
               for k in range(2, icfg.max_set_size + 1))  # fmt: skip
    parts = {"circuits": circuits + searched, "pruning": float(pruned),
             "heads": float(seeds * (layers * heads + sets))}  # fmt: skip
    chosen = icfg.n_features * (1 + icfg.n_random_features)
    steered = icfg.n_features * 2 * sum(1 for a in icfg.steering_alphas if a)
    parts["features"] = float(n_saes + seeds * chosen + steered)
    return parts


SAE_ABLATION_COPIES = 2


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of an interventions job's work: `batch_size` x `runs_per_pass` sequences a
    forward pass (float32, logits included), or the ablation scores' gradient pass over
    `batch_size` prompts with every SAE spliced (ablation_scores.py: attribution's methods, so
    attribution's estimate), whichever is more, with the SAE features a pass ablates; or a
    real model's load where that is more."""
    run = describe(config)
    n_params = run.model.n_params
    iv = config["interventions"]
    batch = int(iv["batch_size"]) * int(iv["runs_per_pass"])
    est = estimate_forward(
        run.model.cfg, n_params, run.prompt_length, None, 0, "float32", "float32", device
    )
    scores = estimate_attribution(
        run.model.cfg, n_params, run.prompt_length, len(run.spliced), run.spliced_width,
        "float32", device, iv["circuit_scores"],
    )  # fmt: skip
    work = max(est.host_peak(batch), scores.host_peak(int(iv["batch_size"])))
    if device == "cpu" and run.spliced:
        # A pass that ablates SAE features (the circuits' candidates, each feature alone for
        # the ablation scores' exact reference) encodes every copy's activations at the
        # hook it is at: SAE_ABLATION_COPIES fp32 d_sae-wide tensors a token (the features
        # and the kept ones the delta decodes), one hook at a time. Measured on the embedded
        # default (prompts of 32 tokens, the plan's length): induction 955 to 1,020 MiB,
        # facts (shorter prompts) 768; planned 942, the forward alone 814.
        work += int(SAE_ABLATION_COPIES * batch * run.prompt_length * run.spliced_width * 4)
    return max(0 if run.model.embedded else load_bytes(n_params), work)


def prompt_work(run: Run, icfg, prompt_length: int | None = None):
    """(forward passes a prompt by part, an upper bound, and FLOPs of one such pass) of the
    interventions over prompts of `prompt_length` tokens (the run's planned length when None),
    every spliced SAE at the widest one's width: what the job's walltime and the report's
    GPU-hours both charge."""
    hooks, d_sae = len(run.spliced), run.spliced_width
    t = run.prompt_length if prompt_length is None else prompt_length
    parts = passes(run.model.cfg, hooks, d_sae, icfg)
    return parts, attribution_forward_flops_per_prompt(run.model.cfg, t, hooks, d_sae)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> Work:
    """The behaviour's prompts times the bound on the runs (`passes`), each a forward pass of
    every prompt with every SAE spliced (prompt_work)."""
    from circuitflow.interventions.config import InterventionsConfig

    run = describe(config)
    icfg = InterventionsConfig.from_dict(config["interventions"])
    n = run.n_prompts(behaviour, icfg.max_prompts)
    parts, per_pass = prompt_work(run, icfg)
    dtype = model_dtype_name(config, "cuda")
    return Work({dtype: n * sum(parts.values()) * per_pass})
