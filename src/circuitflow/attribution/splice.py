"""The patchable forward pass every attribution method runs: the model with every SAE spliced in
(error term kept), each hook point's activation recorded and optionally replaced.

A hook group is one hook point that holds one or more nodes: the token embedding, a layer's
heads (`hook_z`), a layer's MLP output, or a spliced SAE (its features and its error term).
SAEs are spliced with their error terms: out = decode(encode(x)) + (x - decode(encode(x))), so the
spliced model reproduces the clean logits exactly. We splice with our own hook rather than
`HookedSAETransformer.add_sae(use_error_term=True)` because SAELens computes the error under
`no_grad`: gradients to everything upstream of the SAE would then pass only through the
reconstruction (d out/dx = J_sae instead of I) and the error node would get none. Both splices
give the same feature activations and logits (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.metrics import logit_diff
from circuitflow.nodes import EMBED_HOOK, Node, head_hook, hook_name, mlp_hook
from circuitflow.prompts import by_length

__all__ = ["logit_diff"]


@dataclass(frozen=True)
class HookGroup:
    """One hook point whose activation holds one or more nodes."""

    name: str  # hook name, or "<sae hook>.sae" for a spliced SAE (features + error)
    kind: str  # embedding | attn | mlp | sae
    layer: int  # -1 for the embedding
    order: float  # position in the forward pass (nodes.Node.order), for upstream/downstream
    site: str | None = None

    @property
    def hook(self) -> str:
        return self.name.removesuffix(".sae")


def build_groups(n_layers: int, sae_keys: list[tuple[str, int]]) -> list[HookGroup]:
    embed = Node("embedding")
    groups = [HookGroup(EMBED_HOOK, "embedding", -1, embed.order)]
    for layer in range(n_layers):
        groups.append(HookGroup(head_hook(layer), "attn", layer, Node("head", layer, 0).order))
        groups.append(HookGroup(mlp_hook(layer), "mlp", layer, Node("mlp", layer).order))
    for site, layer in sae_keys:
        # An SAE sits on the hook it reads; resid_pre of layer l comes before layer l's heads.
        order = Node("error", layer, -1, site).order
        groups.append(HookGroup(hook_name(site, layer) + ".sae", "sae", layer, order, site))
    return sorted(groups, key=lambda g: g.order)


# --- the patchable forward ------------------------------------------------------------------------
Patch = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Run:
    """Activations of one forward pass: per group, the tensor that flowed on (in the graph when
    gradients are on). SAE groups store `feats` [b, p, d_sae] and `error` [b, p, d]."""

    acts: dict[str, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None


def _sae_hook_fn(sae, key: str, run: Run, patches: dict[str, Patch]):
    def fn(x: torch.Tensor, hook: Any) -> torch.Tensor:
        xin = x.to(sae.dtype)
        feats = sae.encode(xin)
        # The error term keeps its gradient (x - x_hat), so d out / dx = I as in the model itself.
        error = (xin - sae.decode(feats)).to(x.dtype)
        if key + ":feats" in patches:
            feats = patches[key + ":feats"](feats)
        if key + ":error" in patches:
            error = patches[key + ":error"](error)
        run.acts[key + ":feats"] = feats
        run.acts[key + ":error"] = error
        return sae.decode(feats).to(x.dtype) + error

    return fn


def _plain_hook_fn(key: str, run: Run, patches: dict[str, Patch], leaf: bool):
    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
        if leaf and torch.is_grad_enabled():
            act = act.detach().requires_grad_(True)  # the graph's root: parameters are frozen
        if key in patches:
            act = patches[key](act)
        run.acts[key] = act
        return act

    return fn


def forward(
    model,
    tokens: torch.Tensor,
    groups: list[HookGroup],
    saes: dict[str, Any],
    patches: dict[str, Patch] | None = None,
) -> Run:
    """Run the model with every SAE spliced in (error term kept), recording each group's
    activation and applying `patches` (key -> function of the activation). Keys: the hook name
    for plain groups, `<group>:feats` / `<group>:error` for SAE groups."""
    patches = patches or {}
    run = Run()
    hooks = []
    for g in groups:
        if g.kind == "sae":
            hooks.append((g.hook, _sae_hook_fn(saes[g.hook], g.name, run, patches)))
        else:
            hooks.append((g.name, _plain_hook_fn(g.name, run, patches, leaf=g.kind == "embedding")))
    with model.hooks(fwd_hooks=hooks):
        run.logits = model(tokens, return_type="logits")
    return run


# --- node tables ----------------------------------------------------------------------------------
def reduce_nodes(key: str, group: HookGroup, t: torch.Tensor) -> torch.Tensor:
    """Sum a per-element product [b, p, ...] over prompts' positions into per-node values
    [b, n_nodes]: heads for hook_z, features for SAE feats, one node otherwise."""
    if group.kind == "attn":
        return t.sum(dim=(1, 3))
    if key.endswith(":feats"):
        return t.sum(dim=1)
    return t.flatten(1).sum(dim=1, keepdim=True)


def group_keys(g: HookGroup) -> list[str]:
    return [g.name + ":feats", g.name + ":error"] if g.kind == "sae" else [g.name]


@dataclass
class Batch:
    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: torch.Tensor
    distractor: torch.Tensor


def iter_batches(prompts: pd.DataFrame, batch_size: int, device) -> Iterator[Batch]:
    """Prompts of equal length batched together (no padding)."""
    for idx in by_length(prompts["clean_tokens"]):
        for s in range(0, len(idx), batch_size):
            rows = prompts.iloc[idx[s : s + batch_size]]

            def stack(col: str, rows: pd.DataFrame = rows) -> torch.Tensor:
                return torch.tensor(np.stack(rows[col].to_list()), device=device, dtype=torch.long)

            yield Batch(
                stack("clean_tokens"),
                stack("corrupted_tokens"),
                torch.tensor(rows["answer_id"].to_numpy(), device=device, dtype=torch.long),
                torch.tensor(rows["distractor_id"].to_numpy(), device=device, dtype=torch.long),
            )


@torch.no_grad()
def corrupted_acts(model, batch: Batch, groups, saes) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in forward(model, batch.corrupted, groups, saes).acts.items()}


# --- SAEs -----------------------------------------------------------------------------------------
def load_saes(sae_dirs: list[Path | str], device) -> dict[str, Any]:
    """hook name -> SAE (eval mode, on `device`, frozen), from SAELens directories."""
    from circuitflow.sae.files import load_sae

    saes = {}
    for d in sae_dirs:
        sae = load_sae(d, device)
        saes[sae.cfg.metadata.hook_name] = sae
    return saes


@contextmanager
def sae_lens_spliced(model, saes: dict[str, Any]):
    """The model as a HookedSAETransformer with every SAE attached through SAELens, error terms
    on: used to check that our splice and SAELens's agree."""
    from circuitflow.sae.metrics import as_hooked_sae_transformer

    hooked = as_hooked_sae_transformer(model)
    for sae in saes.values():
        hooked.add_sae(sae, use_error_term=True)
    try:
        yield hooked
    finally:
        hooked.reset_saes()
