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

from circuitflow.batching import by_length
from circuitflow.devices import host_tensor, upload
from circuitflow.metrics import logit_diff
from circuitflow.nodes import EMBED_HOOK, Node, head_hook, hook_name, mlp_hook, site_layer
from circuitflow.perf import PassCounter

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


def build_groups(
    n_layers: int, sae_keys: list[tuple[str, int]], mlps: bool = True
) -> list[HookGroup]:
    """The embedding, each layer's heads and (`mlps`: not an attention-only model) MLP, and
    the SAEs at `sae_keys` (site, layer), in forward order."""
    embed = Node("embedding")
    groups = [HookGroup(EMBED_HOOK, "embedding", -1, embed.order)]
    for layer in range(n_layers):
        groups.append(HookGroup(head_hook(layer), "attn", layer, Node("head", layer, 0).order))
        if mlps:
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
    """One forward pass. `acts`: per key, the node tensor that flowed on (its gradient is the
    node's). Keys: the hook name of plain groups, `<group>:feats` [b, p, d_sae] and
    `<group>:error` [b, p, d] of SAE groups. Cut runs (`leaves` given) also record `raw`: each
    key's value as computed from the upstream nodes, in the graph to them. `final`: the last
    layer's residual as the final norm reads it [b, p, d] (direct.py), not a node."""

    acts: dict[str, torch.Tensor] = field(default_factory=dict)
    raw: dict[str, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None
    final: torch.Tensor | None = None


def encode(sae, x: torch.Tensor, bypass_bos: bool) -> torch.Tensor:
    """The SAE's features of x [b, p, d]; zero at position 0 (BOS) when the SAE was trained
    without BOS, so the error term carries BOS whole: the SAE is bypassed there, as in training
    and in the CE metric, and no feature exists only to encode the BOS outlier."""
    feats = sae.encode(x.to(sae.dtype))
    if bypass_bos:
        feats = torch.cat([torch.zeros_like(feats[:, :1]), feats[:, 1:]], dim=1)
    return feats


def _node(key: str, value: torch.Tensor, run: Run, patches, leaves) -> torch.Tensor:
    """The tensor that flows on as node `key`: in a cut run the given leaf (a fresh graph root,
    so gradients stop here), else `value`; then its patch, if any."""
    if leaves is not None:
        run.raw[key] = value
        value = leaves[key].detach().clone().requires_grad_(torch.is_grad_enabled())
    if key in patches:
        value = patches[key](value)
    run.acts[key] = value
    return value


def _sae_hook_fn(sae, key: str, run: Run, patches, leaves, bypass_bos: bool):
    # Features and error are separate nodes (Marks et al. 2024): the features node's gradient is
    # the partial derivative through the decoder alone, the error carries the rest, and the
    # gradient to everything upstream is the plain model's (d out / dx = I).
    feats_key, error_key = key + ":feats", key + ":error"

    def cut(x: torch.Tensor, hook: Any) -> torch.Tensor:
        """A cut run (`leaves`): `raw` must hold the features and error as computed from the
        upstream nodes, in the graph to them, so both go through the encoder."""
        xin = x.to(sae.dtype)
        feats = encode(sae, xin, bypass_bos)
        error = xin - sae.decode(feats)
        f = _node(feats_key, feats.view_as(feats), run, patches, leaves)
        e = _node(error_key, error, run, patches, leaves)
        return (sae.decode(f) + e).to(x.dtype)

    def fn(x: torch.Tensor, hook: Any) -> torch.Tensor:
        """The features as a fresh leaf: the encoder's path to x and the error's path back
        through the decoder cancel exactly (out = decode(f) + x - decode(f)), so neither is
        built, the encoder runs without a graph and the decoder once, unless the features are
        patched (exact patching; ig moves them along their path), when the error still needs
        the clean ones'."""
        xin = x.to(sae.dtype)
        with torch.no_grad():
            feats = encode(sae, xin, bypass_bos)
        leaf = feats.requires_grad_(torch.is_grad_enabled())
        f = _node(feats_key, leaf, run, patches, None)
        decoded = sae.decode(f)
        if f is leaf:
            clean = decoded.detach()
        else:
            with torch.no_grad():
                clean = sae.decode(feats)
        e = _node(error_key, xin - clean, run, patches, None)
        return (decoded + e).to(x.dtype)

    return fn if leaves is None else cut


def _plain_hook_fn(key: str, run: Run, patches, leaves, root: bool):
    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
        if root and leaves is None and torch.is_grad_enabled():
            act = act.detach().requires_grad_(True)  # the graph's root: parameters are frozen
        return _node(key, act, run, patches, leaves)

    return fn


def forward(
    model,
    tokens: torch.Tensor,
    groups: list[HookGroup],
    saes: dict[str, Any],
    patches: dict[str, Patch] | None = None,
    leaves: dict[str, torch.Tensor] | None = None,
    bypass_bos: bool = False,
) -> Run:
    """Run the model with every SAE spliced in (error term kept), recording each node tensor
    and applying `patches` (key -> function of the tensor).

    With `leaves` (key -> value, one per key) the run is cut at every node: each node's tensor
    is its given value as a fresh leaf, so a gradient from a node stops at the nodes directly
    upstream of it (the direct effects of Marks et al. 2024), and `raw` holds what each node
    computes from the leaves upstream of it."""
    patches = patches or {}
    run = Run()
    hooks = []
    for g in groups:
        if g.kind == "sae":
            fn = _sae_hook_fn(saes[g.hook], g.name, run, patches, leaves, bypass_bos)
            hooks.append((g.hook, fn))
        else:
            fn = _plain_hook_fn(g.name, run, patches, leaves, root=g.kind == "embedding")
            hooks.append((g.name, fn))

    def keep_final(act: torch.Tensor, hook: Any) -> torch.Tensor:
        run.final = act
        return act

    hooks.append((final_hook(model), keep_final))
    with model.hooks(fwd_hooks=hooks):
        run.logits = model(tokens, return_type="logits")
    return run


def final_hook(model) -> str:
    """The last layer's resid_post: registered after any SAE there, it sees the spliced value."""
    return hook_name("resid_post", model.cfg.n_layers - 1)


@dataclass
class Spliced:
    """The model with its SAEs spliced in, as every attribution method runs it; `counter`
    counts every pass it runs (perf.PassCounter)."""

    model: Any
    saes: dict[str, Any]
    groups: list[HookGroup]
    bypass_bos: bool = False
    counter: PassCounter = field(default_factory=PassCounter)

    @classmethod
    def of(cls, model, saes: dict[str, Any], bypass_bos: bool = False) -> Spliced:
        keys = sorted((site_layer(h) for h in saes), key=lambda k: (k[1], k[0]))
        groups = build_groups(model.cfg.n_layers, keys, mlps=not model.cfg.attn_only)
        return cls(model, saes, groups, bypass_bos)

    def run(self, tokens: torch.Tensor, patches=None, leaves=None) -> Run:
        self.counter.forward(len(tokens))
        return forward(self.model, tokens, self.groups, self.saes, patches, leaves, self.bypass_bos)

    def grad(self, output: torch.Tensor, inputs: list[torch.Tensor], batch: int, **kwargs):
        """torch.autograd.grad, counted as a backward over `batch` prompts."""
        self.counter.backward(batch)
        return torch.autograd.grad(output, inputs, **kwargs)

    @property
    def group_of(self) -> dict[str, HookGroup]:
        """key -> its hook group."""
        return {k: g for g in self.groups for k in group_keys(g)}

    def keys(self) -> list[str]:
        return [k for g in self.groups for k in group_keys(g)]

    @torch.no_grad()
    def acts(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every node's activation on `tokens` (detached)."""
        return {k: v.detach() for k, v in self.run(tokens).acts.items()}


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
    rows: np.ndarray  # positions of these prompts in the prompt table
    # On the device, for work that stays there (scores.Sums, scores.Kept): each subset's
    # membership of the rows [subsets, b] (float32, 0 or 1), and the positions in the batch of
    # the rows to keep [kept] (the kept rows' count is the host's: len(keep)).
    member: torch.Tensor | None = None
    keep: torch.Tensor | None = None


def make_batch(
    prompts: pd.DataFrame,
    positions: np.ndarray,
    device,
    masks: np.ndarray | None = None,
    keep: np.ndarray | None = None,
) -> Batch:
    """The prompts at `positions`, with `masks` ([subsets, n_prompts] over the prompt table:
    Batch.member) and `keep` (a mask over the prompt table: Batch.keep), in one copy to the
    device that does not block (devices.upload)."""
    rows = prompts.iloc[positions]
    clean = np.stack(rows["clean_tokens"].to_list())
    b, p = clean.shape
    kept = np.flatnonzero(keep[positions]) if keep is not None else np.zeros(0, dtype=np.int64)
    kept_column = np.zeros((b, 1), dtype=np.int64)
    kept_column[: len(kept), 0] = kept
    parts = [
        clean,
        np.stack(rows["corrupted_tokens"].to_list()),
        rows["answer_id"].to_numpy()[:, None],
        rows["distractor_id"].to_numpy()[:, None],
        kept_column,
    ]
    if masks is not None:
        parts.append(masks[:, positions].T)
    host = host_tensor((b, sum(x.shape[1] for x in parts)), torch.int64, device)
    np.concatenate(parts, axis=1, out=host.numpy(), casting="unsafe")
    packed = upload(host, device)
    return Batch(
        packed[:, :p],
        packed[:, p : 2 * p],
        packed[:, 2 * p],
        packed[:, 2 * p + 1],
        positions,
        member=packed[:, 2 * p + 3 :].T.float() if masks is not None else None,
        keep=packed[: len(kept), 2 * p + 2] if keep is not None else None,
    )


def iter_batches(prompts: pd.DataFrame, batch_size: int, device) -> Iterator[Batch]:
    """Prompts of equal length batched together (no padding)."""
    for idx in by_length(prompts["clean_tokens"]):
        for s in range(0, len(idx), batch_size):
            yield make_batch(prompts, idx[s : s + batch_size], device)


def run_batches(
    prompts: pd.DataFrame,
    backoff,
    device,
    fn: Callable[[Batch], Any],
    masks: np.ndarray | None = None,
    keep: np.ndarray | None = None,
) -> Iterator[tuple[Batch, Any]]:
    """(batch, fn(batch)) over prompts of equal length batched together, `backoff`
    (memory.OOMBackoff) choosing the size: a batch that runs out of memory is redone in halves.
    Every prompt is scored alone in its batch row, so only float rounding depends on the size.
    `masks` and `keep` as make_batch's."""
    for idx in by_length(prompts["clean_tokens"]):

        def one(start: int, stop: int, idx=idx) -> tuple[Batch, Any]:
            batch = make_batch(prompts, idx[start:stop], device, masks, keep)
            return batch, fn(batch)

        yield from backoff.chunks(len(idx), one)


# --- SAEs -----------------------------------------------------------------------------------------
def load_saes(sae_dirs: list[Path | str], device) -> dict[str, Any]:
    """hook name -> SAE (eval mode, on `device`, frozen), from SAELens directories. A
    transcoder is refused: spliced at its input hook as an SAE, its features would write there
    rather than into the MLP's output."""
    from circuitflow.errors import InputError
    from circuitflow.sae.files import load_sae
    from circuitflow.sae.transcoder import is_transcoder

    saes = {}
    for d in sae_dirs:
        sae = load_sae(d, device)
        if is_transcoder(sae):
            raise InputError(
                f"{d}: a transcoder; attribution and interventions splice SAEs (sae.kind sae)"
            )
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
