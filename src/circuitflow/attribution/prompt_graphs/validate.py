"""A prompt graph checked against the real model: the model with its transcoders spliced in
(each MLP's output = its transcoder of the MLP's input in this run, a skip transcoder's skip
path included, + the error node, held at its clean value), attention and norms live. Unablated
it is the real model. A cross-layer transcoder: each MLP's output = b_dec + error + skip path +
every layer's (masked) features up to it times their decoders into it, so zeroing a CLT feature
removes all of its writes.

- Feature ablations: each of the graph's most influential features zeroed at its position;
  the measured change of the metric against the change the graph predicts, which propagates
  the ablation through the graph's edges with each downstream feature's activation moving as
  its pre-activation does (the linearisation at the clean run). Their rank agreement
  (Spearman) is the graph's `validation.spearman`. Measured again with every norm's
  denominator held at its clean value (`spearman_frozen_norms`), it says how much of a
  disagreement the norms make: on the embedded model most of it (a feature's write moves the
  residual stream's norm, which the graph holds fixed).
- Faithfulness of the pruned graph: the metric with only the pruned graph's features on (every
  other feature zeroed), against all features on (the clean metric) and none:
  (m_pruned - m_none) / (m_clean - m_none), as the interventions stage defines faithfulness.
"""

from __future__ import annotations

from typing import Any

import torch

from circuitflow.attribution.prompt_graphs.replacement import (
    PromptGraph,
    input_hook,
    is_cross_layer,
    skip_path,
    widths,
)
from circuitflow.attribution.scores import spearman
from circuitflow.metrics import logit_diff
from circuitflow.nodes import mlp_hook


def spliced_metrics(graph: PromptGraph, masks: dict[int, torch.Tensor],
                    freeze_norms: bool = False) -> torch.Tensor:  # fmt: skip
    """The metric of the model with transcoders spliced in, for a batch of feature masks
    {layer: [B, P, d_sae]} (1 keeps a feature's activation at a position, 0 zeroes it);
    `freeze_norms`: every norm's denominator held at the clean run's, as the graph holds it."""
    s = graph.session
    model, dic = s.frozen.model, s.dic
    batch = next(iter(masks.values())).shape[0]
    stash: dict[int, torch.Tensor] = {}

    def read(layer: int):
        def fn(act, hook):
            stash[layer] = act
            return act

        return fn

    def write(layer: int):
        if is_cross_layer(s.transcoders):
            return write_clt(layer)
        tc = s.transcoders.get(layer)

        def fn(act, hook):
            out = dic.decoder_bias[layer] + dic.errors[layer]
            if tc is not None:
                feats = tc.encode(stash[layer].to(tc.dtype)).float() * masks[layer]
                feats = feats * dic.use[None, :, None]
                out = out + feats @ tc.W_dec.float()
                skip = skip_path(s.transcoders, layer, stash[layer].float())
                out = out if skip is None else out + skip
            return out.to(act.dtype).expand(batch, -1, -1)

        return fn

    clt = s.transcoders
    feats: dict[int, torch.Tensor] = {}

    def write_clt(layer: int):
        """Layer `layer`'s output: b_dec + error + skip + every earlier layer's (masked)
        features' decoders into it (CrossLayerTranscoder.decode's sum)."""

        def fn(act, hook):
            x = stash[layer]
            if clt.activation == "batchtopk":  # a prompt's tokens are the batch, not the copies
                f = torch.stack([clt.encode(layer, xb) for xb in x])
            else:
                f = clt.encode(layer, x)
            feats[layer] = f.float() * masks[layer] * dic.use[None, :, None]
            out = (dic.decoder_bias[layer] + dic.errors[layer]).expand(batch, -1, -1)
            for source in range(layer + 1):
                a = feats[source]
                active = torch.nonzero(a.ne(0).flatten(0, 1).any(0)).squeeze(1)
                if active.numel():
                    rows = clt.decoder_rows(source, active)[:, layer - source].float()
                    out = out + a[..., active] @ rows
            skip = skip_path(clt, layer, x.float())
            out = out if skip is None else out + skip
            return out.to(act.dtype)

        return fn

    hooks = []
    if freeze_norms:
        frozen = {k: v for k, v in s.frozen.run.frozen.items() if k.endswith("hook_scale")}
        hooks += [(name, lambda act, hook: frozen[hook.name].expand_as(act)) for name in frozen]
    for layer in range(model.cfg.n_layers):
        mlp_in = input_hook(s.transcoders, layer, model.cfg.normalization_type)
        hooks += [(mlp_in, read(layer)), (mlp_hook(layer), write(layer))]
    tokens = s.frozen.tokens[None].expand(batch, -1)
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return logit_diff(logits, s.answer.expand(batch), s.distractor.expand(batch)).cpu()


def predicted_ablations(graph: PromptGraph, features: list[int]) -> torch.Tensor:
    """The metric's change the graph predicts when each of `features` is zeroed: its
    activation drops by a, every downstream feature's activation moves as its pre-activation
    (the edges per unit of the source's activation), the logit by its incoming edges."""
    n_f = graph.n_features
    a = graph.activations.double()
    per_unit = graph.adjacency[:, :n_f].double() / a[None, :]  # [n, n_f]
    system = torch.eye(n_f, dtype=torch.float64) - per_unit[:n_f]
    kick = torch.zeros(n_f, len(features), dtype=torch.float64)
    kick[features, torch.arange(len(features))] = -a[features]
    moved = torch.linalg.solve_triangular(system, kick, upper=False, unitriangular=True) if \
        _lower(system) else torch.linalg.solve(system, kick)  # fmt: skip
    return (per_unit[graph.logit_index] @ moved).float()


def _lower(m: torch.Tensor) -> bool:
    """Features sorted by layer: a feature reads only earlier layers, so the system is lower
    triangular (a sanity check rather than an assumption)."""
    return bool((m.triu(1) == 0).all())


def validate(graph: PromptGraph, node_mask: torch.Tensor, influence: torch.Tensor,
             n_features: int, threshold: float) -> dict[str, Any]:  # fmt: skip
    """The graph's validation on the real model (see the module's doc), counted under part
    `validation` in graph.passes: one forward of n_features + 3 copies of the prompt."""
    s = graph.session
    n_f, n_pos = graph.n_features, graph.n_pos
    kept_features = torch.nonzero(node_mask[:n_f]).flatten()
    order = influence[kept_features].argsort(descending=True)
    top = kept_features[order[:n_features]].tolist()
    rows = ["clean", "pruned", "none"] + [f"feature {i}" for i in top]
    masks = {}
    feats = graph.features
    for layer, d_sae in widths(s.transcoders).items():
        m = torch.ones(len(rows), n_pos, d_sae)
        m[1:3] = 0.0  # "pruned" turns its features back on below; "none" keeps them off
        on = (feats[:, 0] == layer) & node_mask[:n_f]
        m[1, feats[on, 1], feats[on, 2]] = 1.0
        for r, i in enumerate(top, start=3):
            if feats[i, 0] == layer:
                m[r, feats[i, 1], feats[i, 2]] = 0.0
        masks[layer] = m.to(s.frozen.tokens.device)
    with s.frozen.counter.part("validation"):
        metrics = spliced_metrics(graph, masks)
        ablated = spliced_metrics(graph, {k: m[3:] for k, m in masks.items()}, freeze_norms=True)
        s.frozen.counter.forward(len(rows) + len(top))
    graph.passes = dict(s.frozen.counter.parts)
    clean, pruned, none = (float(x) for x in metrics[:3])
    measured = (metrics[3:] - clean).tolist()
    frozen_norms = (ablated - clean).tolist()
    predicted = predicted_ablations(graph, top).tolist()
    rho = spearman(torch.tensor(predicted).numpy(), torch.tensor(measured).numpy())
    rho_frozen = spearman(torch.tensor(predicted).numpy(), torch.tensor(frozen_norms).numpy())
    denom = clean - none
    undefined = {}  # each null's reason
    if denom == 0:
        undefined["faithfulness"] = (
            "no active features: m_clean = m_none" if n_f == 0
            else "the features move nothing: m_clean = m_none"
        )  # fmt: skip
    for key, r in (("spearman", rho), ("spearman_frozen_norms", rho_frozen)):
        if r is None:
            undefined[key] = (
                f"{len(top)} features ablated: a rank correlation needs 3" if len(top) < 3
                else "the predicted or measured changes are all equal"
            )  # fmt: skip
    return {
        "spliced_metric": clean,
        "metric_pruned": pruned,
        "metric_no_features": none,
        "faithfulness": (pruned - none) / denom if denom != 0 else None,
        "ablations": [
            {
                "feature": graph.features[i].tolist(),
                "predicted": p,
                "measured": m,
                "measured_frozen_norms": f,
            }
            for i, p, m, f in zip(top, predicted, measured, frozen_norms, strict=True)
        ],  # fmt: skip
        "spearman": rho,
        # With the norms' denominators held as the graph holds them: what is left of the
        # disagreement is the features' nonlinearity (TopK's choice, thresholds) and attention.
        "spearman_frozen_norms": rho_frozen,
        "passed": None if rho is None else rho >= threshold,
        "undefined": undefined,
    }
