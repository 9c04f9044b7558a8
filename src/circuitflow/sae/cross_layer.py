"""Cross-layer transcoders (CLTs): one encoder per layer reading that layer's MLP input, and for
each source layer i a decoder writing to the MLP output of layer i and of every later layer
(Ameisen et al. 2025; circuit-tracer 0.5.0's `CrossLayerTranscoder`, whose tensors and maths
these are). `load_clt` and `save_clt` read and write them; the layouts (circuit-tracer's and
Gemma Scope 2's) and their checks are `sae.cross_layer_files`, the memory plan
`sae.cross_layer_plan`, training them `sae.cross_layer_train`.

Shapes, as circuit-tracer holds them (L layers, F features a layer, D = d_model):
`W_enc` [L, F, D], `b_enc` [L, F], `b_dec` [L, D], `W_dec[i]` [F, L - i, D] (entry t - i is
source i's decoder into target layer t >= i), JumpReLU's `threshold` [L, F] and the optional
skip `W_skip` [L, D, D], applied as x_t @ W_skip[t] (circuit-tracer's orientation, and Gemma
Scope 2's `affine_skip_connection`; SAELens's skip transcoders hold its transpose).

The reconstruction of target layer t's MLP output (circuit-tracer's `compute_reconstruction`):
    sum over sources i <= t of  f_i @ W_dec[i][:, t - i, :]   +   b_dec[t]   +   x_t @ W_skip[t]
with f_i source i's features and x_t layer t's input: b_dec once per target layer (not once per
source), the skip from the target layer's own input (circuit-tracer's forward() leaves the
skip's input out and fails on a CLT with one; here forward passes it). Activations: ReLU, JumpReLU
(pre * (pre > threshold), circuit-tracer's `apply_activation_function`), and ours, which
circuit-tracer lacks (its issue #56): TopK (a token's k largest pre-activations, ReLU'd, as
`sae.transcoder.TopKTranscoder`) and BatchTopK (the k * n largest over a batch of n tokens,
ReLU'd, as SAELens's BatchTopK; a token's features then depend on its batch), k per layer.

Encoding runs in the module's dtype, as circuit-tracer's does; the decoder sums (reconstruction)
are float32 whatever the dtype (DESIGN.md's numerics). Decoders may be held (`W_dec`) or read on
demand from disk (`decoders`: an object with `rows(source, rows)`, sae.cross_layer_files'
reader), a source layer's active rows only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import yaml
from safetensors.torch import save_file

from circuitflow.io import atomic_dir
from circuitflow.sae import cross_layer_files as files

ACTIVATIONS = ("relu", "jumprelu", "topk", "batchtopk")
# circuit-tracer's config.yaml defaults (load_clt's feature_input_hook, feature_output_hook):
# block-relative TransformerLens hooks, blocks.{layer}.<hook>.
DEFAULT_INPUT_HOOK = "hook_resid_mid"
DEFAULT_OUTPUT_HOOK = "hook_mlp_out"


class DecoderRows(Protocol):
    """Where a CLT's decoders live when it does not hold them: rows of source layer `source`'s
    decoder, [len(rows), L - source, D] (rows sorted, unique)."""

    def rows(self, source: int, rows: torch.Tensor) -> torch.Tensor: ...


@dataclass
class Components:
    """One prompt's CLT, as its graph needs it (CrossLayerTranscoder.components): the active
    features sorted by (source layer, position, feature), their activations, pre-activations
    (a feature node's input) and encoder rows, and every write, activation x decoder row, one
    per (feature, target layer >= its layer): feature-major, then target (circuit-tracer's
    decoder_vecs with encoder_to_decoder_map and decoder_locations). All float32."""

    PARTS = ("features", "activations", "preacts", "encoders", "writes", "write_feature",
             "write_layer")  # fmt: skip
    features: torch.Tensor  # [n_f, 3] long: source layer, position, feature
    activations: torch.Tensor  # [n_f]
    preacts: torch.Tensor  # [n_f]
    encoders: torch.Tensor  # [n_f, D]
    writes: torch.Tensor  # [n_w, D]
    write_feature: torch.Tensor  # [n_w] long: the row of `features` that writes it
    write_layer: torch.Tensor  # [n_w] long: the target layer it writes to
    reconstruction: torch.Tensor  # [L, P, D]: writes summed + b_dec + skip, every layer

    def errors(self, mlp_out: torch.Tensor) -> torch.Tensor:
        """Each layer's error node [L, P, D]: its real MLP output less the reconstruction."""
        return mlp_out.to(torch.float32) - self.reconstruction


class CrossLayerTranscoder(torch.nn.Module):
    """A CLT with zero weights (fill them, or read a folder with load_clt below).
    `k`: TopK's and BatchTopK's k, one int for every layer or one a layer; `skip`: a W_skip;
    `decoders`: read decoder rows from there instead of holding W_dec."""

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        d_transcoder: int,
        *,
        activation: str = "relu",
        k: int | Sequence[int] | None = None,
        skip: bool = False,
        feature_input_hook: str = DEFAULT_INPUT_HOOK,
        feature_output_hook: str = DEFAULT_OUTPUT_HOOK,
        model_name: str | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        decoders: DecoderRows | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: one of {', '.join(ACTIVATIONS)}")
        L, D, F = int(n_layers), int(d_model), int(d_transcoder)  # noqa: N806 - the maths' names
        self.n_layers, self.d_model, self.d_transcoder = L, D, F
        self.activation = activation
        self.feature_input_hook, self.feature_output_hook = feature_input_hook, feature_output_hook
        self.model_name = model_name
        self.k: tuple[int, ...] | None = None
        if activation in ("topk", "batchtopk"):
            if k is None:
                raise ValueError(f"activation {activation} needs k (one, or one a layer)")
            ks = [int(k)] * L if isinstance(k, int) else [int(v) for v in k]
            if len(ks) != L or not all(0 < v <= F for v in ks):
                raise ValueError(f"k {k!r}: one a layer ({L}), each in 1..{F}")
            self.k = tuple(ks)

        def zeros(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.zeros(*shape, dtype=dtype, device=device), False)

        self.W_enc = zeros(L, F, D)
        self.b_enc = zeros(L, F)
        self.b_dec = zeros(L, D)
        self.threshold = zeros(L, F) if activation == "jumprelu" else None
        self.W_skip = zeros(L, D, D) if skip else None
        self.decoders = decoders
        self.W_dec = (
            None
            if decoders is not None
            else torch.nn.ParameterList(zeros(F, L - i, D) for i in range(L))
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.b_enc.dtype

    @property
    def device(self) -> torch.device:
        return self.b_enc.device

    # --- encoding ---------------------------------------------------------------------------
    def pre_activations(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s pre-activations [..., F] of its input x [..., D]."""
        return x.to(self.dtype) @ self.W_enc[layer].T + self.b_enc[layer]

    def activate(self, layer: int, pre: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s features from its pre-activations [..., F]."""
        if self.activation == "relu":
            return torch.relu(pre)
        if self.activation == "jumprelu":  # circuit-tracer's: the pre-activation, where above
            return pre * (pre > self.threshold[layer])
        k = self.k[layer]
        if self.activation == "topk":
            values, idx = torch.topk(pre, k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, idx, values.relu())
        flat = pre.relu().reshape(-1)  # batchtopk: k a token on average, over the batch
        n = flat.numel() // self.d_transcoder
        values, idx = torch.topk(flat, min(k * n, flat.numel()))
        return torch.zeros_like(flat).scatter(0, idx, values).reshape(pre.shape)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s features [..., F] of its input x [..., D]."""
        return self.activate(layer, self.pre_activations(layer, x))

    def encode_all(self, inputs: torch.Tensor) -> torch.Tensor:
        """Every layer's features [L, ..., F] of the inputs [L, ..., D] (layer l's at l)."""
        self._check_layers(inputs, "inputs")
        return torch.stack([self.encode(layer, inputs[layer]) for layer in range(self.n_layers)])

    # --- decoding ---------------------------------------------------------------------------
    def decoder_rows(self, source: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Rows `rows` (sorted, unique; None: all) of source layer `source`'s decoder,
        [len(rows), L - source, D]: from W_dec, or read from disk (`decoders`)."""
        if self.decoders is not None:
            if rows is None:
                rows = torch.arange(self.d_transcoder)
            # In the module's dtype, as held decoders are: lazy and eager decode alike.
            return self.decoders.rows(source, rows.cpu()).to(self.device, self.dtype)
        w = self.W_dec[source]
        return w if rows is None else w[rows.to(w.device)]

    def decode(
        self, features: torch.Tensor | Sequence[torch.Tensor], inputs: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The reconstruction [L, ..., D] (float32) of every target layer's MLP output from
        every source layer's features ([L, ..., F], or one tensor a layer): see the module's
        doc. `inputs` [L, ..., D], each layer's input, is needed for the skip term of a CLT
        with W_skip (circuit-tracer's compute_reconstruction's input_acts)."""
        self._check_layers(features, "features")
        L, D = self.n_layers, self.d_model  # noqa: N806
        lead = tuple(features[0].shape[:-1])
        b_dec = self.b_dec.to(torch.float32)
        # Out of place, so gradients flow through (attribution differentiates it).
        acc = [b_dec[t].expand(math.prod(lead), D) for t in range(L)]
        for source in range(L):
            f = features[source].reshape(-1, self.d_transcoder).to(self.device, torch.float32)
            # Only the rows a token uses: a lazy decoder reads those alone from disk.
            active = torch.nonzero(f.detach().ne(0).any(0)).squeeze(1)
            if active.numel() == 0:
                continue
            rows = self.decoder_rows(source, active).to(torch.float32)  # [a, L - source, D]
            written = torch.einsum("na,atd->tnd", f[:, active], rows)
            for t in range(source, L):
                acc[t] = acc[t] + written[t - source]
        if self.W_skip is not None:
            if inputs is None:
                raise ValueError("this CLT has a skip connection (W_skip): decode needs inputs")
            self._check_layers(inputs, "inputs")
            x = inputs.to(self.device, torch.float32).reshape(L, -1, D)
            skip = torch.bmm(x, self.W_skip.to(torch.float32))
            acc = [acc[t] + skip[t] for t in range(L)]
        return torch.stack(acc).reshape(L, *lead, D)

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s skip term x @ W_skip[layer] (float32; circuit-tracer's
        compute_skip). ValueError for a CLT without one."""
        if self.W_skip is None:
            raise ValueError("this CLT has no skip connection (W_skip)")
        return x.to(torch.float32) @ self.W_skip[layer].to(torch.float32)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Every layer's reconstructed MLP output [L, ..., D] (float32) from every layer's
        input [L, ..., D]: decode(encode_all(inputs), inputs)."""
        return self.decode(self.encode_all(inputs), inputs)

    @torch.no_grad()
    def components(self, inputs: torch.Tensor, use: torch.Tensor | None = None) -> Components:
        """One prompt's active features and what each writes, for its graph (circuit-tracer's
        compute_attribution_components): `inputs` [L, P, D] each layer's input at P positions;
        `use` [P] bool, the positions whose features count (None: all; circuit-tracer zeroes
        position 0's, after the activation, so BatchTopK still sees it). The reconstruction is
        circuit-tracer's: b_dec and the skip at every position, features only where used."""
        self._check_layers(inputs, "inputs")
        L, D = self.n_layers, self.d_model  # noqa: N806
        x = inputs.to(self.device)
        recon = self.b_dec.to(torch.float32)[:, None, :].repeat(1, x.shape[1], 1)
        if self.W_skip is not None:
            recon += torch.bmm(x.to(torch.float32), self.W_skip.to(torch.float32))
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in Components.PARTS}
        n = 0
        for source in range(L):
            pre = self.pre_activations(source, x[source])
            a = self.activate(source, pre).to(torch.float32)
            if use is not None:
                a = a * use.to(a.device)[:, None]
            pos, idx = torch.nonzero(a, as_tuple=True)  # by position, then feature
            if len(pos) == 0:
                continue
            act = a[pos, idx]
            unique, inverse = idx.unique(return_inverse=True)
            rows = self.decoder_rows(source, unique).to(torch.float32)[inverse]
            written = rows * act[:, None, None]  # [n_s, L - source, D]: feature, then target
            for t in range(source, L):
                recon[t].index_add_(0, pos, written[:, t - source])
            span = L - source
            parts["features"].append(torch.stack([torch.full_like(pos, source), pos, idx], 1))
            parts["activations"].append(act)
            parts["preacts"].append(pre[pos, idx].to(torch.float32))
            parts["encoders"].append(self.W_enc[source][idx].to(torch.float32))
            parts["writes"].append(written.reshape(-1, D))
            ids = torch.arange(n, n + len(pos), device=pos.device)
            parts["write_feature"].append(ids.repeat_interleave(span))
            parts["write_layer"].append(torch.arange(source, L, device=pos.device).repeat(len(pos)))
            n += len(pos)
        empty = {"features": (0, 3), "writes": (0, D), "encoders": (0, D)}
        out = {
            k: torch.cat(v) if v else torch.zeros(empty.get(k, (0,)), device=self.device)
            for k, v in parts.items()
        }
        for k in ("features", "write_feature", "write_layer"):
            out[k] = out[k].long()
        return Components(**out, reconstruction=recon)

    # --- adapting to a model ----------------------------------------------------------------
    @torch.no_grad()
    def fold_input_norm(self, layer: int, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """Make layer `layer`'s encoder (and skip) read n where it read x = weight * n + bias
        (the MLP's input after its norm's weight; n is site mlp_in, ln2.hook_normalized):
        x W_enc^T + b_enc = n (W_enc * weight)^T + (bias W_enc^T + b_enc), and the skip's
        constant bias W_skip moves into b_dec. Exact: features and output unchanged (as
        sae.pretrained.fold_norm does for a per-layer transcoder)."""
        w = weight.detach().to(self.device, torch.float64)
        enc = self.W_enc[layer].double()
        if bias is not None:
            b = bias.detach().to(self.device, torch.float64)
            self.b_enc[layer] += (enc @ b).to(self.dtype)
        self.W_enc[layer] = (enc * w[None, :]).to(self.dtype)
        if self.W_skip is not None:
            skip = self.W_skip[layer].double()  # [D_in, D_out]
            if bias is not None:
                self.b_dec[layer] += (b @ skip).to(self.dtype)
            self.W_skip[layer] = (w[:, None] * skip).to(self.dtype)

    def _check_layers(self, t, what: str) -> None:
        if len(t) != self.n_layers:
            raise ValueError(f"{what}: {len(t)} layers, the CLT has {self.n_layers}")


# --- loading and saving ---------------------------------------------------------------------------
def load_clt(
    folder: Path | str,
    model: files.ModelShape | None = None,
    *,
    lazy: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    resolve: Callable[[str], Path] | None = None,
) -> CrossLayerTranscoder:
    """The CLT in `folder`, either layout, checked by sae.cross_layer_files.open_clt (against
    `model` where given; `resolve`: its hf:// entries), every tensor read checked finite, in
    `dtype` on `device`: decoders held (small sets) or, `lazy`, read from disk a source
    layer's active rows at a time (the published sets: tens of GB)."""
    found = files.open_clt(folder, model, resolve)
    clt = CrossLayerTranscoder(
        found.n_layers, found.d_model, found.d_transcoder, activation=found.activation,
        k=found.k, skip=found.skip, feature_input_hook=found.feature_input_hook,
        feature_output_hook=found.feature_output_hook, model_name=found.model_name,
        dtype=dtype, device=device, decoders=found if lazy else None,
    )  # fmt: skip
    with torch.no_grad():
        for i in range(found.n_layers):
            for role, t in found.encoder(i).items():
                getattr(clt, role)[i] = t.to(dtype)
            if not lazy:
                clt.W_dec[i].copy_(found.decoder(i).to(dtype))
    return clt


def save_clt(clt: CrossLayerTranscoder, folder: Path | str) -> None:
    """Write `clt` in circuit-tracer's layout (circuit-tracer's load_clt reads it; see the
    module's doc for the keys it ignores), atomically: a temporary folder beside `folder`
    renamed onto it when complete."""
    config = {
        "model_kind": files.MODEL_KIND,
        "feature_input_hook": clt.feature_input_hook,
        "feature_output_hook": clt.feature_output_hook,
        "model_name": clt.model_name,
    }
    if clt.k is not None:
        config |= {"activation": clt.activation, "k": list(clt.k)}

    def host(t):
        return t.detach().cpu().contiguous()

    with atomic_dir(folder) as tmp:
        for i in range(clt.n_layers):
            enc = {f"W_enc_{i}": host(clt.W_enc[i]), f"b_enc_{i}": host(clt.b_enc[i]),
                   f"b_dec_{i}": host(clt.b_dec[i])}  # fmt: skip
            if clt.threshold is not None:
                enc[f"threshold_{i}"] = host(clt.threshold[i])
            if clt.W_skip is not None:
                enc[f"W_skip_{i}"] = host(clt.W_skip[i])
            save_file(enc, tmp / files.encoder_file(i))
            save_file({f"W_dec_{i}": host(clt.decoder_rows(i))}, tmp / files.decoder_file(i))
        (tmp / files.CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
