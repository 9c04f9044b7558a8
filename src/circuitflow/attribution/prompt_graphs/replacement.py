"""One prompt's attribution graph in the local replacement model (circuit-tracer's construction,
on the transcoders the pipeline trained, or on a cross-layer transcoder).

The replacement model is the real model run on the prompt with three things held at their clean
values: every attention pattern (`hook_pattern`), every norm's denominator (`hook_scale`), and
every MLP's output (`hook_mlp_out`), which is split into its transcoder's active features
(activation x decoder row), the transcoder's decoder bias, a skip transcoder's linear skip path
(Gemma Scope 2's affine transcoders: x W_skip^T of the MLP's input x) and an error node (the real
output minus the transcoder's). What is left is linear in the token embeddings, the features'
and the error nodes' writes: a node's input (a feature's encoder pre-activation, the
behaviour's logit difference) is the sum of its incoming edges plus bias terms (attention, norm
and decoder biases, positional embeddings), and each edge is an exact direct effect, computed
for a batch of target rows by one backward pass through that frozen model. The skip path is no
node: it stays live in that model, a linear path from the MLP's input to its output, so a
source's edges include what reaches a target through it (circuit-tracer's treatment: its
replacement model adds the skip term to the MLP's output with its gradient kept).

Node order (rows are targets, columns sources, as circuit-tracer's adjacency matrix): active
features sorted by (layer, position, feature), then one error node per (layer, position), layer
major, then one token node per position, then the logit node (the behaviour's metric).

Two kinds of replacement, one code path: per-layer transcoders ({layer: transcoder}) and a
cross-layer transcoder (sae.cross_layer.CrossLayerTranscoder, circuit-tracer's CLT). A feature's
writes are activation x decoder row, one per target layer it writes to: its own layer for a
per-layer transcoder, every layer t >= its layer for a CLT (W_dec[layer][f, t - layer]); its edge
to a target is the sum of its writes dotted with the target's gradient at each target layer, and
layer t's error node is its MLP output less every write into it, the decoder bias and the skip
path (a per-layer set is the CLT whose decoders are zero off the diagonal, and gives the same
graph). A CLT reads each layer's input at its feature_input_hook: the residual stream
(hook_resid_mid) or site mlp_in (after CrossLayerTranscoder.fold_input_norm where it read the
MLP's input after its norm's weight).

The first position (BOS, `skip_bos`): no features there (circuit-tracer zeroes them too), and its
error node is the whole MLP output less the skip path (its decoder bias included), where
circuit-tracer zeroes the first position's error nodes (PromptGraph.first_position says so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from circuitflow.attribution.prompt_graphs import prune
from circuitflow.metrics import logit_diff
from circuitflow.nodes import EMBED_HOOK, head_hook, hook_name, mlp_hook
from circuitflow.perf import PassCounter
from circuitflow.sae.cross_layer import CrossLayerTranscoder
from circuitflow.sae.cross_layer_files import INPUT_READS
from circuitflow.sae.transcoder import skip_weight

# Held at their clean values: what makes the model linear in the nodes' writes. The norms of
# queries and keys (Qwen3's, Gemma 3's q_norm and k_norm, whose scale is per head, not per
# position) feed only the pattern, which is held anyway.
FROZEN_SUFFIXES = ("hook_pattern", "hook_scale")
PATTERN_ONLY = (".q_norm.", ".k_norm.")


def frozen_hook(name: str) -> bool:
    """Whether the replacement model holds hook `name` at its clean value."""
    return name.endswith(FROZEN_SUFFIXES) and not any(p in name for p in PATTERN_ONLY)


FIRST_POSITION = {
    True: "no features at the first position; its error nodes hold the whole MLP output less "
    "the skip path (circuit-tracer zeroes them)",
    False: "features at every position, the first included",
}


def is_cross_layer(transcoders) -> bool:
    """Whether `transcoders` is a cross-layer transcoder (else {layer: per-layer transcoder})."""
    return isinstance(transcoders, CrossLayerTranscoder)


def widths(transcoders) -> dict[int, int]:
    """Each replaced layer's number of features."""
    if is_cross_layer(transcoders):
        return dict.fromkeys(range(transcoders.n_layers), transcoders.d_transcoder)
    return {layer: tc.cfg.d_sae for layer, tc in transcoders.items()}


def input_hook(transcoders, layer: int, normalization: str | None) -> str:
    """The hook whose value layer `layer`'s encoder reads: site mlp_in, or for a CLT that reads
    the residual stream (feature_input_hook hook_resid_mid, hook_mlp_in) hook_resid_mid."""
    if is_cross_layer(transcoders) and INPUT_READS[transcoders.feature_input_hook] == "residual":
        return hook_name("resid_mid", layer)
    return hook_name("mlp_in", layer, normalization)


def logit_target(n_pos: int) -> torch.Tensor:
    """The logit node as a target row (layer, position, feature): layer -1, the last position."""
    return torch.tensor([-1, n_pos - 1, 0])


@dataclass
class PromptGraph:
    """One prompt's graph. `adjacency[t, s]` is the direct effect of node s on node t's input."""

    tokens: list[int]
    answer: int
    distractor: int
    n_layers: int
    features: torch.Tensor  # [n_f, 3] long: layer, position, feature index
    activations: torch.Tensor  # [n_f] float32
    adjacency: torch.Tensor  # [n, n] float32
    # [n, L, H]: what each head writes that reaches each target (Rows.heads; 0 for sources)
    head_attribution: torch.Tensor
    inputs: torch.Tensor  # [n] float32: each node's input in the real run (0 for sources)
    biases: torch.Tensor  # [n] float32: each target's input with every source set to zero
    metric: float  # the behaviour's logit difference in the real model
    answer_prob: float  # the answer's probability in the real model
    dropped_features: int = 0  # active features over max_feature_nodes, folded into errors
    first_position: str = FIRST_POSITION[True]  # how the first position is treated
    passes: dict[str, float] = field(default_factory=dict)
    # What computes more rows of this graph (heads.split_edges): the frozen model and the
    # prompt's whole dictionary, and which of its features the graph kept.
    session: Session | None = field(default=None, repr=False)
    kept: torch.Tensor | None = field(default=None, repr=False)

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_pos

    @property
    def n_nodes(self) -> int:
        return self.n_features + self.n_errors + self.n_pos + 1

    def error_index(self, layer: int, pos: int) -> int:
        return self.n_features + layer * self.n_pos + pos

    def token_index(self, pos: int) -> int:
        return self.n_features + self.n_errors + pos

    @property
    def logit_index(self) -> int:
        return self.n_nodes - 1

    def position(self, i: int) -> int:
        """Node i's position in the prompt."""
        if i < self.n_features:
            return int(self.features[i, 1])
        if i < self.n_features + self.n_errors:
            return (i - self.n_features) % self.n_pos
        return min(i - self.n_features - self.n_errors, self.n_pos - 1)

    def write_layer(self, i: int) -> int:
        """The layer whose MLP writes source node i (-1: a token, before every layer)."""
        if i < self.n_features:
            return int(self.features[i, 0])
        if i < self.n_features + self.n_errors:
            return (i - self.n_features) // self.n_pos
        return -1

    def read_layer(self, i: int) -> int:
        """The layer whose MLP reads target node i (the logit: after the last layer)."""
        return int(self.features[i, 0]) if i < self.n_features else self.n_layers

    def columns(self, rows: Rows) -> torch.Tensor:
        """`rows` (edges from every feature of the prompt's dictionary) as rows of this
        graph's adjacency [R, n]: the features it dropped folded into their error nodes."""
        feats, errors = rows.features.cpu(), rows.errors.cpu()
        if self.kept is not None:
            all_features = self.session.dic.features.cpu()
            feats, errors = fold_columns(feats, errors, all_features, self.kept, self.n_pos)
        zero = torch.zeros(len(feats), 1)
        return torch.cat([feats, errors, rows.tokens.cpu(), zero], dim=1)

    def kinds(self) -> list[str]:
        """Each node's kind, in node order."""
        return (
            ["feature"] * self.n_features
            + ["error"] * self.n_errors
            + ["token"] * self.n_pos
            + ["logit"]
        )


@dataclass
class Session:
    """What build computed a graph's rows with, kept to compute more (heads.split_edges)."""

    frozen: FrozenModel
    dic: Dictionary
    transcoders: dict[int, Any] | CrossLayerTranscoder
    answer: torch.Tensor
    distractor: torch.Tensor

    def rows(self, targets: torch.Tensor, through=None, part="graph_rows") -> Rows:
        return compute_rows(self.frozen, self.dic, targets, self.transcoders, self.answer,
                            self.distractor, through, part)  # fmt: skip


@dataclass
class CleanRun:
    """What the replacement model holds fixed, from one clean forward pass of the prompt."""

    frozen: dict[str, torch.Tensor]  # hook name -> pattern / norm scale
    embed: torch.Tensor  # [P, d]
    mlp_in: dict[int, torch.Tensor]  # layer -> [P, d]: what its encoder reads (input_hook)
    mlp_out: dict[int, torch.Tensor]  # layer -> [P, d]
    metric: float
    answer_prob: float


def clean_run(model, tokens: torch.Tensor, answer: int, distractor: int,
              transcoders=None) -> CleanRun:  # fmt: skip
    """The clean run; each layer's input where `transcoders`' encoders read it (input_hook;
    default site mlp_in)."""
    n_layers = model.cfg.n_layers
    norms = model.cfg.normalization_type
    tcs = {} if transcoders is None else transcoders
    ins = {input_hook(tcs, layer, norms): layer for layer in range(n_layers)}
    outs = {mlp_hook(layer): layer for layer in range(n_layers)}

    def wanted(name: str) -> bool:
        return frozen_hook(name) or name in ins or name in outs or name == EMBED_HOOK

    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens[None], names_filter=wanted)
    frozen = {k: v.float() for k, v in cache.items() if frozen_hook(k)}
    pair = [torch.tensor([t], device=logits.device) for t in (answer, distractor)]
    last = logits[0, -1].float()
    return CleanRun(
        frozen=frozen,
        embed=cache[EMBED_HOOK][0].float(),
        mlp_in={layer: cache[name][0].float() for name, layer in ins.items()},
        mlp_out={layer: cache[name][0].float() for name, layer in outs.items()},
        metric=float(logit_diff(logits, *pair)[0]),
        answer_prob=float(last.softmax(-1)[answer]),
    )


@dataclass
class Dictionary:
    """The prompt's transcoder features: active ones, their decoder writes and the errors."""

    features: torch.Tensor  # [n_f, 3] (layer, pos, feature), sorted
    activations: torch.Tensor  # [n_f]
    preacts: torch.Tensor  # [n_f] encoder pre-activations (each feature node's input)
    writes: torch.Tensor  # [n_w, d] activation x decoder row, one per (feature, target layer)
    write_feature: torch.Tensor  # [n_w] long: the feature (row of `features`) writing it
    write_layer: torch.Tensor  # [n_w] long: the layer it writes to (a feature's own, or later)
    errors: torch.Tensor  # [n_layers, P, d]
    decoder_bias: torch.Tensor  # [n_layers, P, d] b_dec where a transcoder replaces the MLP
    use: torch.Tensor  # [P] bool: the positions where transcoders replace the MLPs
    # [n_layers, P, d]: each skip transcoder's skip path in the clean run (0 elsewhere): the
    # part of the MLP output the frozen model computes live from the MLP's input (skip_path)
    skip: torch.Tensor | None = None

    def leaves(self, run: CleanRun) -> torch.Tensor:
        """[n_layers, P, d]: each MLP's output less its skip path, the value the frozen model
        writes for it (the skip path added live): the features, decoder bias and error."""
        mlp = torch.stack([run.mlp_out[layer] for layer in range(len(run.mlp_out))])
        return mlp if self.skip is None else mlp - self.skip


def skip_path(transcoders, layer: int, x: torch.Tensor) -> torch.Tensor | None:
    """The skip path x W_skip^T of layer `layer`'s transcoder for its MLP input `x` [..., P, d]
    (a CLT's x @ W_skip[layer]), or None where it has none. At every position, BOS included
    where the features are left out there (skip_bos), as circuit-tracer's replacement model
    adds it at every position."""
    if is_cross_layer(transcoders):
        return None if transcoders.W_skip is None else transcoders.skip(layer, x.float())
    tc = transcoders.get(layer)
    w = None if tc is None else skip_weight(tc)
    return None if w is None else x @ w.float().T


def encoder_preacts(tc, x: torch.Tensor, features=slice(None)) -> torch.Tensor:
    """A transcoder's encoder pre-activations (x W_enc + b_enc) of `features` (default all):
    a feature node's input."""
    w, b = tc.W_enc[:, features].float(), tc.b_enc[features].float()
    return tc.process_sae_in(x.to(tc.dtype)).float() @ w + b


def node_preacts(transcoders, layer: int, x: torch.Tensor, feature: int) -> torch.Tensor:
    """Feature `feature` of layer `layer`'s encoder pre-activation for the input `x` (float32):
    a feature node's input."""
    if not is_cross_layer(transcoders):
        return encoder_preacts(transcoders[layer], x, feature)
    clt = transcoders
    w, b = clt.W_enc[layer, feature].float(), clt.b_enc[layer, feature].float()
    return x.to(clt.dtype).float() @ w + b


def decompose(run: CleanRun, transcoders, skip: torch.Tensor) -> Dictionary:
    """Each MLP output as its transcoder's active features + decoder bias + skip path + error,
    at the positions not in `skip` (BOS, where the transcoders were not trained: there the whole
    output less a skip transcoder's skip path is the error node, as the spliced evaluations
    leave BOS to the real MLP; circuit-tracer adds the skip path there too). A CLT:
    decompose_clt."""
    if is_cross_layer(transcoders):
        return decompose_clt(run, transcoders, skip)
    n_layers = len(run.mlp_out)
    d = run.embed.shape[1]
    errors = torch.stack([run.mlp_out[layer] for layer in range(n_layers)]).clone()
    bias = torch.zeros_like(errors)
    skips = torch.zeros_like(errors)
    feats, acts, pre, writes = [], [], [], []
    use = ~skip
    for layer, tc in sorted(transcoders.items()):
        x = run.mlp_in[layer]
        with torch.no_grad():
            a = tc.encode(x.to(tc.dtype)).float() * use[:, None]
            z = encoder_preacts(tc, x)
            w_dec = tc.W_dec.float()
            b_dec = tc.b_dec.float()
            s = skip_path(transcoders, layer, x)
        pos, idx = torch.nonzero(a, as_tuple=True)  # sorted by position, then feature
        feats.append(torch.stack([torch.full_like(pos, layer), pos, idx], dim=1))
        acts.append(a[pos, idx])
        pre.append(z[pos, idx])
        writes.append(a[pos, idx, None] * w_dec[idx])
        bias[layer, use] = b_dec
        if s is not None:
            skips[layer] = s
        errors[layer] -= (a @ w_dec) + bias[layer] + skips[layer]
    skips = skips if any(skip_weight(tc) is not None for tc in transcoders.values()) else None
    if not feats:
        empty, none = torch.zeros(0), torch.zeros(0, dtype=torch.long)
        return Dictionary(torch.zeros(0, 3, dtype=torch.long), empty, empty, torch.zeros(0, d),
                          none, none, errors, bias, use, skips)  # fmt: skip
    features = torch.cat(feats)
    # One write a feature, into its own layer: the CLT whose decoders are zero off the diagonal.
    return Dictionary(features, torch.cat(acts), torch.cat(pre), torch.cat(writes),
                      torch.arange(len(features), device=features.device), features[:, 0].clone(),
                      errors, bias, use, skips)  # fmt: skip


def decompose_clt(run: CleanRun, clt: CrossLayerTranscoder, skip: torch.Tensor) -> Dictionary:
    """decompose for a CLT (CrossLayerTranscoder.components: circuit-tracer's active features,
    sorted by layer, position, feature, and their writes into every later layer): layer t's
    error is its MLP output less every source layer's features times its decoder into t, b_dec
    where features are used and the skip path (at every position); at the positions in `skip`
    b_dec is part of the error node, as for per-layer transcoders. The sums are decompose's,
    term for term, so a CLT whose decoders are zero off the diagonal gives its graph exactly."""
    n_layers = len(run.mlp_out)
    inputs = torch.stack([run.mlp_in[layer] for layer in range(n_layers)])
    use = ~skip
    comps = clt.components(inputs, use)
    errors = torch.stack([run.mlp_out[layer] for layer in range(n_layers)]).clone()
    bias = torch.zeros_like(errors)
    skips = torch.zeros_like(errors)
    dense = errors.new_zeros(n_layers, errors.shape[1], clt.d_transcoder)  # [L, P, F]
    layer, pos, feat = comps.features.T
    dense[layer, pos, feat] = comps.activations
    with torch.no_grad():
        for t in range(n_layers):
            recon = None
            for source in range(t + 1):
                a = dense[source]
                if clt.W_dec is not None:  # held: every row, as decompose's a @ W_dec
                    part = a @ clt.W_dec[source][:, t - source].float()
                else:  # read from disk: the active rows alone
                    active = torch.nonzero(a.ne(0).any(0)).squeeze(1)
                    rows = clt.decoder_rows(source, active)[:, t - source].float()
                    part = a[:, active] @ rows
                recon = part if recon is None else recon + part
            bias[t, use] = clt.b_dec[t].float()
            s = skip_path(clt, t, inputs[t])
            if s is not None:
                skips[t] = s
            errors[t] -= recon + bias[t] + skips[t]
    return Dictionary(comps.features, comps.activations, comps.preacts, comps.writes,
                      comps.write_feature, comps.write_layer, errors, bias, use,
                      skips if clt.W_skip is not None else None)  # fmt: skip


class FrozenModel:
    """The replacement model of one prompt, run on a batch of copies: sources are leaves
    (embedding and every MLP output less its skip path), patterns and norm scales the clean
    run's; skip transcoders' skip paths (of `transcoders`) computed live from each MLP's
    input."""

    def __init__(self, model, tokens: torch.Tensor, run: CleanRun, counter: PassCounter,
                 transcoders: dict[int, Any] | None = None) -> None:  # fmt: skip
        self.model, self.tokens, self.run, self.counter = model, tokens, run, counter
        self.n_layers = model.cfg.n_layers
        self.transcoders = {} if transcoders is None else transcoders

    def forward(self, embed: torch.Tensor, mlp_out: torch.Tensor, through=None):
        """(logits, mlp_in per layer, hook_z per layer) with `embed` [B, P, d] and `mlp_out`
        [B, L, P, d] written into the residual stream in place of the real ones.

        `through` [B, 2] (layer, head; layer -1: none) routes batch element b's
        gradient (the values are unchanged): above its layer it stays at its position (each
        head's gradient reaches only its own position's value), at its layer it goes only
        through its head's attention to other positions (the residual skip, the other heads
        and the head's own position cut), below it everywhere. Its edges are then the paths
        whose last move into the position is that head (heads.py)."""
        batch = embed.shape[0]
        read: dict[int, torch.Tensor] = {}
        zs: dict[int, torch.Tensor] = {}
        vs: dict[int, torch.Tensor] = {}

        def frozen(act, hook):
            return self.run.frozen[hook.name].expand(batch, *act.shape[1:]).to(act.dtype)

        def put_embed(act, hook):
            return embed.to(act.dtype)

        def put_mlp(layer: int):
            def fn(act, hook):
                skip = skip_path(self.transcoders, layer, read[layer])
                out = mlp_out[:, layer] if skip is None else mlp_out[:, layer] + skip
                return out.to(act.dtype)

            return fn

        def keep(store: dict, layer: int):
            def fn(act, hook):
                store[layer] = act
                return act

            return fn

        def own_position(layer: int, rows: torch.Tensor):
            """hook_z with the gradient of `rows` reaching only each query's own value."""

            def fn(z, hook):
                diag = self.own_term(layer, vs[layer][rows])  # [r, P, H, d_head]
                cut = z[rows].detach() + (diag - diag.detach()).to(z.dtype)
                zs[layer] = z.index_put((rows,), cut)
                return zs[layer]

            return fn

        def only_head(layer: int, rows: torch.Tensor, heads: torch.Tensor):
            """hook_resid_mid with the gradient of `rows` going only into their head's
            attention to other positions."""
            w_o = self.model.blocks[layer].attn.W_O  # [H, d_head, d]

            def fn(resid_mid, hook):
                picked = torch.arange(len(rows), device=rows.device)
                own = self.own_term(layer, vs[layer][rows])[picked, :, heads]
                z = zs[layer][rows, :, heads] - own  # [r, P, d_head]: other positions only
                out = torch.einsum("rpe,red->rpd", z, w_o[heads].to(z.dtype))
                cut = resid_mid[rows].detach() + (out - out.detach()).to(resid_mid.dtype)
                return resid_mid.index_put((rows,), cut)

            return fn

        hooks = [(name, frozen) for name in self.run.frozen]
        hooks.append((EMBED_HOOK, put_embed))
        for layer in range(self.n_layers):
            hooks.append((f"blocks.{layer}.attn.hook_v", keep(vs, layer)))
            hooks.append((head_hook(layer), keep(zs, layer)))
            if through is not None:
                device = embed.device
                above = torch.nonzero((through[:, 0] >= 0) & (through[:, 0] < layer)).flatten()
                if above.numel():
                    hooks.append((head_hook(layer), own_position(layer, above.to(device))))
                at = torch.nonzero(through[:, 0] == layer).flatten()
                if at.numel():
                    fn = only_head(layer, at.to(device), through[at, 1].to(device))
                    hooks.append((hook_name("resid_mid", layer), fn))
            hooks.append((mlp_hook(layer), put_mlp(layer)))
            mlp_in = input_hook(self.transcoders, layer, self.model.cfg.normalization_type)
            hooks.append((mlp_in, keep(read, layer)))
        toks = self.tokens[None].expand(batch, -1)
        logits = self.model.run_with_hooks(toks, fwd_hooks=hooks)
        return logits, read, zs

    def own_term(self, layer: int, v: torch.Tensor) -> torch.Tensor:
        """Each query's attention to its own position times its value, [B, P, H, d_head]:
        the part of hook_z that does not move across positions."""
        pattern = self.run.frozen[f"blocks.{layer}.attn.hook_pattern"][0]  # [H, Q, K]
        own = pattern.diagonal(dim1=1, dim2=2).transpose(0, 1)  # [P, H]
        v = v.repeat_interleave(pattern.shape[0] // v.shape[2], dim=2)  # grouped KV heads
        return own[None, :, :, None].to(v.dtype) * v

    def values(self, embed, mlp_out, targets, transcoders, answer, distractor, rows=None,
               through=None):  # fmt: skip
        """(each target's input, hook_z per layer): `targets` [R, 3] (layer, pos, feature;
        layer -1 = the logit), target i read in batch element rows[i] (default: i)."""
        logits, read, zs = self.forward(embed, mlp_out, through)
        rows = range(len(targets)) if rows is None else rows
        out = []
        for r, (layer, pos, feat) in zip(rows, targets.tolist(), strict=True):
            if layer < 0:
                out.append(logit_diff(logits[r : r + 1], answer, distractor)[0])
            else:
                out.append(node_preacts(transcoders, layer, read[layer][r, pos], feat))
        return torch.stack(out), zs


@dataclass
class Rows:
    """Edges into a batch of targets from every source, and each head's share of each
    target's input (gradient x hook_z, summed over positions: what the head writes that
    reaches the target, bias terms included)."""

    features: torch.Tensor  # [R, n_f]
    errors: torch.Tensor  # [R, L * P]
    tokens: torch.Tensor  # [R, P]
    heads: torch.Tensor  # [R, L, H]


def compute_rows(
    frozen: FrozenModel,
    dic: Dictionary,
    targets: torch.Tensor,
    transcoders: dict[int, Any] | CrossLayerTranscoder,
    answer: torch.Tensor,
    distractor: torch.Tensor,
    through: torch.Tensor | None = None,
    part: str = "graph_rows",
) -> Rows:
    """Edges into `targets` [R, 3] from every source, by one forward and one backward of R
    copies of the prompt (`through`: FrozenModel.forward's, the paths through one head)."""
    run, n_rows = frozen.run, len(targets)
    embed = run.embed.expand(n_rows, -1, -1).clone().requires_grad_(True)
    mlp = dic.leaves(run).expand(n_rows, -1, -1, -1).clone().requires_grad_(True)
    with frozen.counter.part(part):
        value, zs = frozen.values(embed, mlp, targets, transcoders, answer, distractor,
                                  through=through)  # fmt: skip
        frozen.counter.forward(n_rows)
        z = [zs[layer] for layer in range(frozen.n_layers)]
        grads = torch.autograd.grad(value.sum(), [embed, mlp, *z], allow_unused=True)
        frozen.counter.backward(n_rows)
    g_embed, g_mlp, g_z = grads[0], grads[1], grads[2:]
    g_embed = torch.zeros_like(embed) if g_embed is None else g_embed
    g_mlp = torch.zeros_like(mlp) if g_mlp is None else g_mlp
    heads = torch.stack(
        [
            (g * zl).sum(dim=(1, 3)) if g is not None else zl.new_zeros(zl.shape[0], zl.shape[2])
            for g, zl in zip(g_z, z, strict=True)
        ],
        dim=1,
    )
    return Rows(
        features=feature_edges(g_mlp, dic).detach(),
        errors=(g_mlp * dic.errors).sum(-1).flatten(1).detach(),
        tokens=(g_embed * run.embed).sum(-1).detach(),
        heads=heads.detach(),
    )


def feature_edges(g_mlp: torch.Tensor, dic: Dictionary) -> torch.Tensor:
    """[R, n_f]: each feature's writes dotted with the rows' gradient at the layer written and
    the feature's position, summed over its target layers; a target layer at a time
    ([R, P, n_layer] products, never an [R, n_w, d] gather)."""
    out = g_mlp.new_zeros(g_mlp.shape[0], len(dic.features))
    for layer in dic.write_layer.unique().tolist():
        idx = torch.nonzero(dic.write_layer == layer).flatten()
        feature = dic.write_feature[idx]
        at_pos = g_mlp[:, layer] @ dic.writes[idx].T  # [R, P, n_layer]
        picked = at_pos[:, dic.features[feature, 1], torch.arange(len(idx), device=idx.device)]
        out.index_add_(1, feature, picked)  # onto zeros: a per-layer set's values exactly
    return out


def biases(frozen: FrozenModel, dic, targets, transcoders, answer, distractor) -> torch.Tensor:
    """Each target's input with every source's write zero: the bias terms (the decoder biases
    stay, being no node)."""
    with torch.no_grad(), frozen.counter.part("graph_bias"):
        embed = torch.zeros_like(frozen.run.embed)[None]
        frozen.counter.forward(1)
        rows = [0] * len(targets)  # one pass: the bias run is the same for every target
        return frozen.values(embed, dic.decoder_bias[None], targets, transcoders, answer,
                             distractor, rows)[0]  # fmt: skip


def build(
    model,
    transcoders: dict[int, Any] | CrossLayerTranscoder,
    tokens: list[int],
    answer: int,
    distractor: int,
    *,
    skip_bos: bool,
    max_feature_nodes: int,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> PromptGraph:
    """The prompt's graph. With more active features than `max_feature_nodes`, rows are
    computed for the features most influential on the logit so far, a batch at a time (as
    circuit-tracer does), and the rest are folded into their error nodes (the graph stays
    exact: an error node is then the MLP output its kept features do not explain). Memory
    grows with the rows computed times the active features, and with the kept graph's square.
    The graph's `passes` counts its forward-pass equivalents by part (perf.PassCounter).
    `transcoders`: {layer: per-layer transcoder} or a CrossLayerTranscoder."""
    counter = PassCounter()
    device = next(model.parameters()).device
    toks = torch.tensor(tokens, device=device)
    ans = torch.tensor([answer], device=device)
    dis = torch.tensor([distractor], device=device)
    with counter.part("graph_clean"):
        run = clean_run(model, toks, answer, distractor, transcoders)
        counter.forward(1)
    skip = torch.zeros(len(tokens), dtype=torch.bool)
    if skip_bos:
        skip[0] = True
    dic = decompose(run, transcoders, skip.to(device))
    frozen = FrozenModel(model, toks, run, counter, transcoders)
    n_f, n_layers, n_pos = len(dic.features), model.cfg.n_layers, len(tokens)
    n_err = n_layers * n_pos
    n = n_f + n_err + n_pos + 1  # columns: every active feature of the prompt
    budget = min(n_f, max_feature_nodes)
    store = torch.zeros(budget + 1, n)  # the rows computed, in the order computed
    store_heads = torch.zeros(budget + 1, n_layers, model.cfg.n_heads)
    row_nodes: list[int] = []  # each stored row's node (n - 1: the logit)

    def rows_for(index: torch.Tensor) -> None:
        """Compute the rows of the features `index` (and -1: the logit)."""
        targets = torch.stack(
            [dic.features[i].cpu() if i >= 0 else logit_target(n_pos) for i in index.tolist()]
        )
        got = compute_rows(frozen, dic, targets, transcoders, ans, dis)
        k0, k1 = len(row_nodes), len(row_nodes) + len(index)
        store[k0:k1, :n_f] = got.features.cpu()
        store[k0:k1, n_f : n_f + n_err] = got.errors.cpu()
        store[k0:k1, n_f + n_err : n - 1] = got.tokens.cpu()
        store_heads[k0:k1] = got.heads.cpu()
        row_nodes.extend(i if i >= 0 else n - 1 for i in index.tolist())
        if progress is not None:
            progress(len(index))

    rows_for(torch.tensor([-1]))
    done = torch.zeros(n_f, dtype=torch.bool)
    weights = torch.zeros(n)
    weights[-1] = 1.0
    while int(done.sum()) < budget:
        take = min(batch_size, budget - int(done.sum()))
        if n_f <= max_feature_nodes:
            order = torch.arange(n_f)
        else:  # the most influential features so far (circuit-tracer's greedy visit)
            computed = len(row_nodes)
            inf = prune.influence_rows(store[:computed], torch.tensor(row_nodes), weights)
            order = torch.argsort(inf[:n_f], descending=True, stable=True)
        index = order[~done[order]][:take]
        rows_for(index)
        done[index] = True

    # The graph: the features with rows, the others folded into their error nodes.
    computed = len(row_nodes)
    kept = torch.nonzero(done).flatten()
    n_kept = len(kept)
    feats, errors = fold_columns(store[:computed, :n_f], store[:computed, n_f : n_f + n_err],
                                 dic.features.cpu(), done, n_pos)  # fmt: skip
    cols = torch.cat([feats, errors, store[:computed, n_f + n_err :]], dim=1)
    new_index = torch.full((n,), -1, dtype=torch.long)
    new_index[kept] = torch.arange(n_kept)
    new_index[n_f:] = torch.arange(n_kept, n_kept + n - n_f)
    rows = new_index[torch.tensor(row_nodes)]
    size = n_kept + n - n_f
    adjacency = torch.zeros(size, size)
    adjacency[rows] = cols
    head_attribution = torch.zeros(size, n_layers, model.cfg.n_heads)
    head_attribution[rows] = store_heads[:computed]
    targets = torch.cat([dic.features.cpu()[kept], logit_target(n_pos)[None]])
    inputs = torch.zeros(size)
    inputs[:n_kept] = dic.preacts.cpu()[kept]
    inputs[-1] = run.metric
    bias = torch.zeros(size)
    bias[torch.cat([torch.arange(n_kept), torch.tensor([size - 1])])] = biases(
        frozen, dic, targets, transcoders, ans, dis
    ).cpu()
    graph = PromptGraph(
        tokens=list(tokens),
        answer=answer,
        distractor=distractor,
        n_layers=n_layers,
        features=dic.features.cpu()[kept],
        activations=dic.activations.cpu()[kept],
        adjacency=adjacency,
        head_attribution=head_attribution,
        inputs=inputs,
        biases=bias,
        metric=run.metric,
        answer_prob=run.answer_prob,
        dropped_features=n_f - n_kept,
        first_position=FIRST_POSITION[bool(skip_bos)],
        session=Session(frozen, dic, transcoders, ans, dis),
        kept=done.clone(),
    )
    graph.passes = dict(counter.parts)
    return graph


def fold_columns(feats: torch.Tensor, errors: torch.Tensor, features: torch.Tensor,
                 keep: torch.Tensor, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Edges from every active feature [R, n_f] and error node [R, L * P] as edges from the
    kept features and error nodes: a dropped feature's column is added to its (layer,
    position)'s error column (its write becomes part of that error node), so every input is
    still its incoming edges plus biases."""
    if bool(keep.all()):
        return feats, errors
    dropped = torch.nonzero(~keep).flatten()
    at = features[dropped, 0] * n_pos + features[dropped, 1]
    errors = errors.clone().index_add_(1, at, feats[:, dropped])
    return feats[:, keep], errors
