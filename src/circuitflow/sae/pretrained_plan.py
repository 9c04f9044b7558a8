"""The job plans of published dictionaries (rules prefetch_saes and pretrained_sae): host memory
and counted work for circuitflow.resources (the rule table).

A pretrained_sae job evaluates a group of sites and layers (`members`, grouped as the streaming
jobs are: circuitflow.stream_groups, `sae.stream.layers_per_job`), one dictionary after another
with the model loaded once: its memory is its widest member's, its work the sum of its
members'. The rule table passes the group's key (`resid_pre:0,resid_pre:1`) as `job`.

A published dictionary's width is its own, not the config's, as the run's description states it
(circuitflow.description: its cfg.json, a local directory's or a release's once prefetch_saes
has put it in the Hugging Face cache; jobs are planned when they are scheduled, after the
prefetch), else the config's `sae.expansion_factor` x d_model."""

from __future__ import annotations

from circuitflow.description import describe
from circuitflow.memory import estimate_forward, load_bytes
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.perf import Work
from circuitflow.sae.plan import EVAL_BATCH, sae_param_bytes
from circuitflow.sae.stream_plan import StreamGroup
from circuitflow.sites import dictionary_sites

ENCODES = 3  # the SAE runs on the statistics' rows, in the spliced pass and in the firing pass


def members(config: dict) -> list[tuple[str, int]]:
    """Every published dictionary's (site, layer), by layer and then in the config's order of
    sites (a transcoder's, mlp_out, last), as circuitflow.stream_groups splits them into jobs."""
    return [(site, int(layer)) for layer in config["layers"] for site in dictionary_sites(config)]


def group_of(config: dict, job: str | None) -> StreamGroup:
    """The job's group (its key, as the rule passes it); every dictionary in one group when
    None."""
    return StreamGroup.parse(job) if job else StreamGroup(tuple(members(config)))


def job_bytes(config: dict, rule: str, device: str, job: str | None = None) -> int:
    """Host bytes of the work. prefetch_saes: one dictionary loaded at a time (its parameters
    and the copy they are read into). pretrained_sae (`job`: its group's key): the model in
    float32 twice (the one loaded and the HookedSAETransformer copy the evaluation splices
    into), one dictionary at a time (the group's widest), a batch of the evaluation (a forward
    pass to the logits, the features of its rows), or a real model's load where that is
    more."""
    run = describe(config)
    cfg = run.model.cfg
    group = group_of(config, job if rule == "pretrained_sae" else None)
    d_sae = run.widest(group.members)
    sae_bytes = sae_param_bytes(cfg.d_model, d_sae)
    if rule == "prefetch_saes":
        return 2 * sae_bytes
    n_params, t = run.model.n_params, run.context_length
    features = t * d_sae * 4 * 2  # a row's features and their non-zero mask, per context
    est = estimate_forward(
        cfg, n_params, t, None, 1, "float32", "float32", device,
        buffers=n_params * 4 + sae_bytes,
    )  # fmt: skip
    host = est.host_peak(EVAL_BATCH)
    if not device.startswith("cuda"):
        host += EVAL_BATCH * features
    return max(0 if run.model.embedded else load_bytes(n_params), host)


def job_work(config: dict, rule: str, job: str | None = None) -> Work | None:
    """pretrained_sae (`job`: its group's key): for each member, `sae.eval_contexts` contexts
    through the model three times (clean, spliced, ablated) and once as deep as its layer
    (which latents fire), and its dictionary's encoder and decoder on every position of each.
    prefetch_saes: none counted (its time is the download)."""
    if rule != "pretrained_sae":
        return None
    run = describe(config)
    cfg, t = run.model.cfg, run.context_length
    n = config["sae"]["eval_contexts"]
    flops = 0.0
    for site, layer in group_of(config, job).members:
        passes = 3 * forward_flops_per_token(cfg, t) + forward_flops_per_token(
            cfg, t, layer + 1, unembed=False
        )
        d_sae = run.dictionary(site, layer).width
        flops += n * t * (passes + ENCODES * 4.0 * cfg.d_model * d_sae)
    return Work({"float32": flops})
