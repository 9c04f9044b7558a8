"""SAE quality measured on the model itself: reconstruction and spliced cross-entropy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from sae_lens import SAE, HookedSAETransformer
from transformer_lens import HookedTransformer

from circuitflow.devices import precise_math
from circuitflow.metrics import next_token_losses
from circuitflow.perf import PassCounter
from circuitflow.sae.plan import EVAL_BATCH
from circuitflow.sae.transcoder import is_transcoder, transcoder_output


def as_hooked_sae_transformer(model: HookedTransformer) -> HookedSAETransformer:
    """Return ``model`` as a HookedSAETransformer (a weight-sharing-free copy if it is not one).

    HookedSAETransformer only adds hook points and SAE bookkeeping to HookedTransformer, so the
    plain model's state dict loads into it unchanged.
    """
    if isinstance(model, HookedSAETransformer):
        return model
    hooked = HookedSAETransformer(model.cfg, tokenizer=model.tokenizer)
    hooked.load_state_dict(model.state_dict(), strict=True)
    return hooked.to(model.cfg.device).eval()


# --- what both evaluations accumulate -------------------------------------------------------------
# Long sums in float64: 64 contexts x 31 tokens of losses, 10^5 squared activations.
@dataclass
class Reconstruction:
    """Running float64 sums behind a dictionary's L0 and the explained variance of its
    target (an SAE's input, a transcoder's MLP output) by its output, about the target's mean
    over every evaluated position."""

    sq_err: float = 0.0
    l0: float = 0.0
    target_sum: torch.Tensor | float = 0.0
    target_sq: float = 0.0
    n: int = 0

    def add(self, target: torch.Tensor, recon: torch.Tensor, feats: torch.Tensor) -> None:
        """`target` and `recon` float32 [n, d], `feats` the dictionary's activations [n, d_sae]."""
        self.sq_err += (target - recon).double().pow(2).sum().item()
        self.l0 += (feats != 0).sum().item()
        self.target_sum = self.target_sum + target.double().sum(0)
        self.target_sq += target.double().pow(2).sum().item()
        self.n += target.shape[0]

    def result(self) -> dict[str, float | None]:
        """`explained_variance` is None where the target has no variance to explain (an MLP
        that writes nothing, a constant site): `target_variance` (per position, summed over
        dimensions) says so; a ratio there would divide by zero or by rounding error."""
        total_var = max(0.0, self.target_sq - self.target_sum.pow(2).sum().item() / self.n)
        explained = (
            None if constant_target(total_var, self.target_sq) else 1.0 - self.sq_err / total_var
        )
        return {"l0": self.l0 / self.n, "explained_variance": explained,
                "target_variance": total_var / self.n}  # fmt: skip


def constant_target(total_var: float, target_sq: float) -> bool:
    """Whether a target whose float64 sums give `total_var` (squared deviations from its mean)
    and `target_sq` (its squares) is constant: zero, or a mean whose cancellation leaves only
    rounding (float64 sums keep about 1e-15 of target_sq; 1e-9 leaves a wide margin)."""
    return total_var <= 1e-9 * target_sq


@dataclass
class Losses:
    """Running float64 sums of the next-token losses of the clean, spliced and ablated runs."""

    sums: dict[str, float] = field(
        default_factory=lambda: {"ce_clean": 0.0, "ce_sae": 0.0, "ce_zero": 0.0}
    )
    n_tokens: int = 0

    def add(self, toks: torch.Tensor, **logits: torch.Tensor) -> None:
        """`logits` by key of `sums` (float32 losses whatever the logits' dtype)."""
        for key, out in logits.items():
            self.sums[key] += next_token_losses(out, toks).double().sum().item()
        self.n_tokens += toks.shape[0] * (toks.shape[1] - 1)

    def result(self) -> dict[str, float | None]:
        ce = {k: v / self.n_tokens for k, v in self.sums.items()}
        denom = ce["ce_zero"] - ce["ce_clean"]
        recovered = (ce["ce_zero"] - ce["ce_sae"]) / denom if denom != 0 else None
        return {**ce, "ce_loss_recovered": recovered}


def trained_positions(toks: torch.Tensor, exclude_bos: bool, bos_token_id: int) -> torch.Tensor:
    """Where the dictionary was trained: every position but BOS when its data excluded BOS."""
    return (toks != bos_token_id) if exclude_bos else torch.ones_like(toks, dtype=torch.bool)


def zero_at(keep: torch.Tensor):
    """A hook zeroing the activation at `keep`'s positions (the ablation baseline)."""

    def zero(act: torch.Tensor, hook: object) -> torch.Tensor:
        return act * (~keep).unsqueeze(-1).to(act.dtype)

    return zero


# --- the evaluations ------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_sae(
    model: HookedTransformer,
    sae: SAE[Any],
    contexts: torch.Tensor,
    *,
    exclude_bos: bool,
    bos_token_id: int,
    batch_size: int = EVAL_BATCH,
    counter: PassCounter | None = None,
) -> dict[str, float | None]:
    """Return l0, explained_variance, ce_clean, ce_sae, ce_zero and ce_loss_recovered, in
    float32 (losses from float32 logits, sums in float64) whatever the model's dtype.

    The SAE is spliced in with ``HookedSAETransformer.add_sae`` at ``sae.cfg.metadata.hook_name``.
    When the training data excluded BOS, the SAE is bypassed at BOS (as SAELens's
    ``exclude_special_tokens`` does) and the zero-ablation leaves BOS alone too, so all three
    losses differ only where the SAE was trained. `counter` counts the model's three forward
    passes per batch (parts `ce_clean`, `ce_sae`, `ce_zero`).
    """
    counter = counter if counter is not None else PassCounter()
    hook_name = sae.cfg.metadata.hook_name
    if not hook_name:
        raise ValueError("SAE has no metadata.hook_name; add_sae would silently skip it")
    hooked = as_hooked_sae_transformer(model)
    device = hooked.cfg.device
    sae = sae.to(device).eval()
    exclude = [bos_token_id] if exclude_bos else False
    recon, losses = Reconstruction(), Losses()
    with precise_math():
        for start in range(0, len(contexts), batch_size):
            toks = contexts[start : start + batch_size].to(device)
            keep = trained_positions(toks, exclude_bos, bos_token_id)

            with counter.part("ce_clean"):
                logits, cache = hooked.run_with_cache(toks, names_filter=hook_name)
                counter.forward(len(toks))
            x = cache[hook_name][keep].float()
            feats = sae.encode(x.to(sae.dtype))
            recon.add(x, sae.decode(feats).float(), feats)

            hooked.add_sae(sae, use_error_term=False, exclude_special_tokens=exclude)
            try:
                with counter.part("ce_sae"):
                    logits_sae = hooked(toks, return_type="logits")
                    counter.forward(len(toks))
            finally:
                hooked.reset_saes()

            with counter.part("ce_zero"):
                logits_zero = hooked.run_with_hooks(toks, fwd_hooks=[(hook_name, zero_at(keep))])
                counter.forward(len(toks))
            losses.add(toks, ce_clean=logits, ce_sae=logits_sae, ce_zero=logits_zero)
    return {**recon.result(), **losses.result()}


@torch.no_grad()
def evaluate_transcoders(
    model: HookedTransformer,
    transcoders: dict[int, Any],
    contexts: torch.Tensor,
    *,
    exclude_bos: bool,
    bos_token_id: int,
    batch_size: int = EVAL_BATCH,
    counter: PassCounter | None = None,
) -> dict[str, Any]:
    """Transcoders measured on the model, every MLP in `transcoders` ({layer: transcoder})
    replaced at once: `ce_sae` with each MLP's output computed by its transcoder from the MLP's
    input in the same (replaced) run, `ce_zero` with those MLP outputs zeroed, `ce_clean`, and
    per layer the L0 and the explained variance of the MLP output on the clean run's inputs
    (`layers`; with one transcoder also at the top level, as evaluate_sae's keys). Float32
    throughout, sums in float64; BOS is left to the real MLP when the training data excluded it
    (as evaluate_sae bypasses an SAE there). `counter` counts the three forward passes a batch.
    """
    counter = counter if counter is not None else PassCounter()
    device = model.cfg.device
    hooks = {
        layer: (tc.cfg.metadata.hook_name, tc.cfg.metadata.hook_name_out)
        for layer, tc in transcoders.items()
    }
    for tc in transcoders.values():
        tc.to(device).eval()
    names = sorted({name for pair in hooks.values() for name in pair})
    recon = {layer: Reconstruction() for layer in hooks}
    losses = Losses()

    def replace(layer: int, keep: torch.Tensor, stash: dict) -> list:
        tc = transcoders[layer]
        hook_in, hook_out = hooks[layer]

        def read(act: torch.Tensor, hook: object) -> None:
            stash[layer] = act

        def write(act: torch.Tensor, hook: object) -> torch.Tensor:
            out = transcoder_output(tc, stash.pop(layer)).to(act.dtype)
            return torch.where(keep.unsqueeze(-1), out, act)

        return [(hook_in, read), (hook_out, write)]

    with precise_math():
        for start in range(0, len(contexts), batch_size):
            toks = contexts[start : start + batch_size].to(device)
            keep = trained_positions(toks, exclude_bos, bos_token_id)
            with counter.part("ce_clean"):
                logits, cache = model.run_with_cache(toks, names_filter=names)
                counter.forward(len(toks))
            for layer, (hook_in, hook_out) in hooks.items():
                tc = transcoders[layer]
                x = cache[hook_in][keep]
                feats = tc.encode(x.to(tc.dtype))
                out = transcoder_output(tc, x, feats).float()
                recon[layer].add(cache[hook_out][keep].float(), out, feats)
            stash: dict[int, torch.Tensor] = {}
            fwd = [hook for layer in hooks for hook in replace(layer, keep, stash)]
            with counter.part("ce_sae"):
                logits_tc = model.run_with_hooks(toks, fwd_hooks=fwd)
                counter.forward(len(toks))
            with counter.part("ce_zero"):
                zeroed = [(out, zero_at(keep)) for _, out in hooks.values()]
                logits_zero = model.run_with_hooks(toks, fwd_hooks=zeroed)
                counter.forward(len(toks))
            losses.add(toks, ce_clean=logits, ce_sae=logits_tc, ce_zero=logits_zero)

    layers = {layer: r.result() for layer, r in recon.items()}
    single = next(iter(layers.values())) if len(layers) == 1 else {}
    return {**single, **losses.result(), "layers": layers}


def evaluate_dictionary(model, dictionary, layer: int, contexts: torch.Tensor, **kwargs) -> dict:
    """An SAE (evaluate_sae) or a transcoder replacing its layer's MLP alone
    (evaluate_transcoders), with the keys of metrics.json."""
    if not is_transcoder(dictionary):
        return evaluate_sae(model, dictionary, contexts, **kwargs)
    quality = evaluate_transcoders(model, {layer: dictionary}, contexts, **kwargs)
    quality.pop("layers")
    return quality
