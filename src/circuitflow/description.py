"""The run, described once: what every planner reads instead of the raw config.

`describe(config)` turns a resolved config into a frozen `Run`: the model's shape, parameter
count and dtype; every dictionary's site, layer, kind and real width, with where the width came
from; the context and prompt lengths; the prompts of each behaviour; and the cluster the jobs
are planned for. The stages' plans (`<stage>/plan.py`), the rule table (circuitflow.resources),
the grouping of the SAE jobs and the report's GPU-hours read it, so a fact about the run has one
home here and every consumer sees the same value.

A dictionary's width is its own: a published dictionary's `d_sae` as its cfg.json states it (a
local directory's, or a release's once prefetch_saes has put it in the Hugging Face cache),
else, like every trained dictionary, `sae.d_sae` or `sae.expansion_factor` x the model's
d_model (`trained_width`). A release not fetched yet is planned at the trained width, and its
description is not kept: the jobs are planned again after the prefetch, at the width it states.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from circuitflow import dictionary_sources, published
from circuitflow.cluster import Cluster
from circuitflow.errors import ConfigError, InputError
from circuitflow.memory import prompt_length
from circuitflow.model import architectures
from circuitflow.sites import dictionary_kind, dictionary_sites, sae_sites

# Tokens of a real model's capture context when `capture.context_length` is not set.
REAL_CONTEXT = 128


@dataclass(frozen=True)
class Model:
    """The configured model's shape, without loading it (model.architectures.model_cfg)."""

    name: str
    architecture: str | None  # a key of model.architectures.ARCHITECTURES, None for others
    embedded: bool
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    n_params: int
    dtype: str  # `model.dtype`: a torch dtype's name, or auto (memory.model_dtype resolves it)
    # The TransformerLens-like config the FLOP and memory formulas read (model.flops, memory).
    cfg: Any = field(compare=False, repr=False)


@dataclass(frozen=True)
class Dictionary:
    """One dictionary of the run: where it sits, what it is and how wide it is."""

    site: str
    layer: int
    kind: str  # sae or transcoder (sites.dictionary_kind)
    width: int  # its latents (d_sae)
    width_from: str  # where the width came from, in words
    # The most latents active at a position, as planned: a TopK or BatchTopK dictionary's k
    # (a published one's from its config, else twice the L0 its release lists), else twice
    # `sae.target_l0`; and where that came from, in words.
    active: int = 0
    active_from: str = ""


@dataclass(frozen=True)
class Run:
    """A resolved config as the planners read it (`describe`)."""

    model: Model
    source: str  # sae.source: capture, stream or pretrained
    layers: tuple[int, ...]
    spliced_sites: tuple[str, ...]  # the sites whose SAEs attribution splices (sites.sae_sites)
    dictionaries: tuple[Dictionary, ...]  # by site (the config's order), then layer
    context_length: int  # tokens of a capture (token set) context, BOS included
    prompt_length: int  # tokens a prompt is planned at (memory.prompt_length)
    prompts: tuple[tuple[str, int], ...]  # (behaviour, n_prompts), the config's order
    cluster: Cluster
    # Contexts of the token set capture_tokens builds (token_set_contexts).
    token_set_contexts: int = 0
    # Whether every width is known: False while a release's cfg.json is not fetched yet.
    widths_known: bool = True

    def dictionary(self, site: str, layer: int) -> Dictionary:
        for d in self.dictionaries:
            if (d.site, d.layer) == (site, int(layer)):
                return d
        raise KeyError(f"the run has no dictionary at site {site}, layer {layer}")

    def widest(self, members: Iterable[tuple[str, int]] | None = None) -> int:
        """The largest width among `members` (site, layer) (every dictionary when None)."""
        chosen = self.dictionaries if members is None else [self.dictionary(*m) for m in members]
        return max((d.width for d in chosen), default=0)

    @property
    def spliced(self) -> tuple[Dictionary, ...]:
        """The SAEs attribution, interventions and prompt graphs' splices run with."""
        return tuple(
            d for d in self.dictionaries if d.kind == "sae" and d.site in self.spliced_sites
        )

    @property
    def spliced_width(self) -> int:
        """The widest spliced SAE: each is planned at it (0 without SAEs)."""
        return max((d.width for d in self.spliced), default=0)

    @property
    def transcoders(self) -> tuple[Dictionary, ...]:
        return tuple(d for d in self.dictionaries if d.kind == "transcoder")

    @property
    def transcoder_width(self) -> int:
        return max((d.width for d in self.transcoders), default=0)

    def n_prompts(self, behaviour: str | None = None, cap: int | None = None) -> int:
        """The behaviour's prompts (the largest behaviour's when none or an unknown one is
        named), at most `cap`."""
        counts = dict(self.prompts)
        n = counts[behaviour] if behaviour in counts else max(counts.values(), default=0)
        return min(n, cap) if cap else n


def trained_width(d_sae: int | None, expansion_factor: int, d_in: int) -> int:
    """The latents of a dictionary the run trains: `sae.d_sae`, else `sae.expansion_factor` x
    its input's width."""
    return int(d_sae or expansion_factor * d_in)


def context_length(config: Mapping[str, Any], n_ctx: int) -> int:
    """Tokens of a capture context, BOS included: `capture.context_length`, else the model's
    context `n_ctx` (a real model's at most REAL_CONTEXT)."""
    real = config["model"]["name"] != "embedded"
    return config["capture"]["context_length"] or (min(n_ctx, REAL_CONTEXT) if real else n_ctx)


def token_set_contexts(config: Mapping[str, Any], context_len: int) -> int:
    """Contexts of the token set capture_tokens builds, of `context_len` tokens each (BOS
    included): the capture's (`capture.n_tokens` rows, BOS left out of each context unless
    `capture.exclude_bos` is false), or where the dictionary source trains on the token set
    (`sae.source: stream`) `sae.total_tokens` training rows and `sae.eval_contexts` held-out
    contexts."""
    per_context = context_len - int(bool(config["capture"]["exclude_bos"]))
    if not dictionary_sources.token_set_source(config).trains_on_token_set:
        return math.ceil(config["capture"]["n_tokens"] / per_context)
    sae = config["sae"]
    return math.ceil(sae["total_tokens"] / per_context) + sae["eval_contexts"]


def published_view(
    config: Mapping[str, Any], site: str, layer: int
) -> tuple[dict[str, Any], str] | None:
    """A published dictionary's cfg.json (published.cfg_view, with an integer d_sae) and where
    it was read, or None where it cannot be read here (a release not fetched yet; a directory
    the job will refuse in one line)."""
    try:
        d = published.dictionary_for(config, site, layer)
        view = published.view_of(d, config["model"]["hf_cache"]) or {}
        if d.path is not None:
            where = f"{d.label}'s config" if d.converted else f"{d.path}/{published.CFG_FILE}"
        else:
            where = f"{d.release} {d.sae_id}'s config in the Hugging Face cache"
    except (ConfigError, InputError, KeyError, TypeError):
        return None
    return (view, where) if isinstance(view.get("d_sae"), int) else None


def trained_active(sae: Mapping[str, Any]) -> tuple[int, str]:
    """The most latents a dictionary the run trains has active at a position: `sae.k` for TopK
    and BatchTopK, else planned at twice `sae.target_l0` (JumpReLU and ReLU)."""
    if sae["architecture"] in ("topk", "batchtopk"):
        return int(sae["k"]), "sae.k"
    return int(2 * sae["target_l0"]), "2 x sae.target_l0"


def release_active(config: Mapping[str, Any], site: str, layer: int) -> tuple[int, str] | None:
    """Twice the L0 SAELens's directory lists for a published release's dictionary (Gemma
    Scope 2's JumpReLU transcoders state no k), and where it came from; None where it lists
    none or the dictionary is not a release's."""
    try:
        d = published.dictionary_for(config, site, layer)
        if d.release is None:
            return None
        l0 = published.resolve_release(d.release, d.sae_id).published.get("l0")
    except (ConfigError, KeyError, TypeError):
        return None
    return (math.ceil(2 * l0), f"2 x {d.release} {d.sae_id}'s listed L0") if l0 else None


def _dictionaries(config: Mapping[str, Any], d_model: int) -> tuple[tuple[Dictionary, ...], bool]:
    sae = config["sae"]
    trained = trained_width(sae["d_sae"], sae["expansion_factor"], d_model)
    how = "sae.d_sae" if sae["d_sae"] else f"sae.expansion_factor x d_model {d_model}"
    active, active_how = trained_active(sae)
    found, known = [], True
    # Published dictionaries (sae.source pretrained, or the transcoders' sae.transcoders.source)
    # have their own width and their own k (a TopK's in its config; else twice the L0 its
    # release lists, where it lists one).
    for site in dictionary_sites(config):
        published_source = dictionary_sources.source_of(config, site).changes_dictionaries(
            "sae.pretrained"
        )
        for layer in config["layers"]:
            width, where, k, k_where = trained, how, active, active_how
            if published_source:
                read = published_view(config, site, int(layer))
                view, cfg_file = read or ({}, "")
                if read is None:
                    known = False
                    where = f"{how} (its cfg.json not readable yet: planned at the config's)"
                    k_where = f"{active_how} (its cfg.json not readable yet)"
                else:
                    width, where = view["d_sae"], cfg_file
                    k_where = f"{active_how} ({cfg_file} states no k)"
                if isinstance(view.get("k"), int):
                    k, k_where = view["k"], cfg_file
                elif listed := release_active(config, site, int(layer)):
                    k, k_where = listed
            kind = dictionary_kind(config, site)
            found.append(Dictionary(site, int(layer), kind, width, where, min(k, width), k_where))
    return tuple(found), known


def build(config: Mapping[str, Any], cluster: Cluster | None = None) -> Run:
    """The description of a resolved config (`describe` keeps it)."""
    cfg = architectures.model_cfg(config)
    name = str(config["model"]["name"])
    model = Model(
        name=name,
        architecture=architectures.architecture_key(name),
        embedded=name == "embedded",
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.d_head,
        d_mlp=cfg.d_mlp,
        d_vocab=cfg.d_vocab,
        n_ctx=cfg.n_ctx,
        n_params=architectures.n_params(cfg),
        dtype=str(config["model"]["dtype"]),
        cfg=cfg,
    )
    dictionaries, known = _dictionaries(config, cfg.d_model)
    t = context_length(config, cfg.n_ctx)
    return Run(
        model=model,
        source=config["sae"]["source"],
        layers=tuple(int(n) for n in config["layers"]),
        spliced_sites=tuple(sae_sites(config)),
        dictionaries=dictionaries,
        context_length=t,
        prompt_length=prompt_length(config, cfg),
        prompts=tuple((b, int(spec["n_prompts"])) for b, spec in config["behaviours"].items()),
        cluster=cluster or Cluster(),
        token_set_contexts=token_set_contexts(config, t),
        widths_known=known,
    )


# Descriptions built, by the config's content and the cluster: the rule table asks for every
# job's plan, and each plan for the description.
_BUILT: dict[tuple[str, Cluster], Run] = {}
_KEEP = 64


def describe(config: Mapping[str, Any], cluster: Cluster | None = None) -> Run:
    """The run a resolved config describes, built once per config and cluster (a description
    whose widths are not all known yet is built again next time)."""
    key = (json.dumps(config, sort_keys=True, default=str), cluster or Cluster())
    if key in _BUILT:
        return _BUILT[key]
    run = build(config, key[1])
    if run.widths_known:
        if len(_BUILT) >= _KEEP:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = run
    return run
