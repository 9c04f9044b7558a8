"""SAE quality measured on the model itself: reconstruction and spliced cross-entropy."""

from __future__ import annotations

from typing import Any

import torch
from sae_lens import SAE, HookedSAETransformer
from transformer_lens import HookedTransformer

from circuitflow.devices import precise_math
from circuitflow.metrics import next_token_losses
from circuitflow.perf import PassCounter


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


@torch.no_grad()
def evaluate_sae(
    model: HookedTransformer,
    sae: SAE[Any],
    contexts: torch.Tensor,
    *,
    exclude_bos: bool,
    bos_token_id: int,
    batch_size: int = 16,
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

    # Long sums in float64: 64 contexts x 31 tokens of losses, 10^5 squared activations.
    ce_sum = {"ce_clean": 0.0, "ce_sae": 0.0, "ce_zero": 0.0}
    n_tokens = 0
    sq_err = l0_sum = 0.0
    x_sum: torch.Tensor | None = None
    x_sq_sum = 0.0
    n_pos = 0
    with precise_math():
        for start in range(0, len(contexts), batch_size):
            toks = contexts[start : start + batch_size].to(device)
            keep = (
                (toks != bos_token_id) if exclude_bos else torch.ones_like(toks, dtype=torch.bool)
            )

            with counter.part("ce_clean"):
                logits, cache = hooked.run_with_cache(toks, names_filter=hook_name)
                counter.forward(len(toks))
            x = cache[hook_name][keep].float()
            feats = sae.encode(x.to(sae.dtype))
            recon = sae.decode(feats).float()
            sq_err += (x - recon).double().pow(2).sum().item()
            l0_sum += (feats != 0).sum().item()
            x_sum = x.double().sum(0) if x_sum is None else x_sum + x.double().sum(0)
            x_sq_sum += x.double().pow(2).sum().item()
            n_pos += x.shape[0]

            hooked.add_sae(sae, use_error_term=False, exclude_special_tokens=exclude)
            try:
                with counter.part("ce_sae"):
                    logits_sae = hooked(toks, return_type="logits")
                    counter.forward(len(toks))
            finally:
                hooked.reset_saes()

            def zero_hook(
                act: torch.Tensor, hook: object, keep: torch.Tensor = keep
            ) -> torch.Tensor:
                return act * (~keep).unsqueeze(-1).to(act.dtype)

            with counter.part("ce_zero"):
                logits_zero = hooked.run_with_hooks(toks, fwd_hooks=[(hook_name, zero_hook)])
                counter.forward(len(toks))
            for key, out in (
                ("ce_clean", logits),
                ("ce_sae", logits_sae),
                ("ce_zero", logits_zero),
            ):
                ce_sum[key] += next_token_losses(out, toks).double().sum().item()
            n_tokens += toks.shape[0] * (toks.shape[1] - 1)

    ce = {k: v / n_tokens for k, v in ce_sum.items()}
    assert x_sum is not None
    # Total variance about the mean over all evaluated positions.
    total_var_num = x_sq_sum - (x_sum.pow(2).sum().item() / n_pos)
    denom = ce["ce_zero"] - ce["ce_clean"]
    return {
        "l0": l0_sum / n_pos,
        "explained_variance": 1.0 - sq_err / total_var_num,
        **ce,
        "ce_loss_recovered": (ce["ce_zero"] - ce["ce_sae"]) / denom if denom != 0 else None,
    }


@torch.no_grad()
def evaluate_transcoders(
    model: HookedTransformer,
    transcoders: dict[int, Any],
    contexts: torch.Tensor,
    *,
    exclude_bos: bool,
    bos_token_id: int,
    batch_size: int = 16,
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
    ce_sum = {"ce_clean": 0.0, "ce_sae": 0.0, "ce_zero": 0.0}
    stats = {layer: {"sq_err": 0.0, "l0": 0.0, "x_sum": 0.0, "x_sq": 0.0} for layer in hooks}
    n_tokens = n_pos = 0

    def replace(layer: int, keep: torch.Tensor, stash: dict) -> list:
        tc = transcoders[layer]
        hook_in, hook_out = hooks[layer]

        def read(act: torch.Tensor, hook: object) -> None:
            stash[layer] = act

        def write(act: torch.Tensor, hook: object) -> torch.Tensor:
            out = tc.decode(tc.encode(stash.pop(layer).to(tc.dtype))).to(act.dtype)
            return torch.where(keep.unsqueeze(-1), out, act)

        return [(hook_in, read), (hook_out, write)]

    with precise_math():
        for start in range(0, len(contexts), batch_size):
            toks = contexts[start : start + batch_size].to(device)
            keep = (
                (toks != bos_token_id) if exclude_bos else torch.ones_like(toks, dtype=torch.bool)
            )
            with counter.part("ce_clean"):
                logits, cache = model.run_with_cache(toks, names_filter=names)
                counter.forward(len(toks))
            for layer, (hook_in, hook_out) in hooks.items():
                tc, s = transcoders[layer], stats[layer]
                x, y = cache[hook_in][keep].float(), cache[hook_out][keep].double()
                feats = tc.encode(x.to(tc.dtype))
                s["sq_err"] += (y - tc.decode(feats).double()).pow(2).sum().item()
                s["l0"] += (feats != 0).sum().item()
                s["x_sum"] = s["x_sum"] + y.sum(0)
                s["x_sq"] += y.pow(2).sum().item()
            n_pos += int(keep.sum())
            stash: dict[int, torch.Tensor] = {}
            fwd = [hook for layer in hooks for hook in replace(layer, keep, stash)]
            with counter.part("ce_sae"):
                logits_tc = model.run_with_hooks(toks, fwd_hooks=fwd)
                counter.forward(len(toks))

            def zero(act: torch.Tensor, hook: object, keep: torch.Tensor = keep) -> torch.Tensor:
                return act * (~keep).unsqueeze(-1).to(act.dtype)

            with counter.part("ce_zero"):
                zeroed = [(out, zero) for _, out in hooks.values()]
                logits_zero = model.run_with_hooks(toks, fwd_hooks=zeroed)
                counter.forward(len(toks))
            for key, out in (("ce_clean", logits), ("ce_sae", logits_tc), ("ce_zero", logits_zero)):
                ce_sum[key] += next_token_losses(out, toks).double().sum().item()
            n_tokens += toks.shape[0] * (toks.shape[1] - 1)

    ce = {k: v / n_tokens for k, v in ce_sum.items()}
    denom = ce["ce_zero"] - ce["ce_clean"]
    layers = {}
    for layer, s in stats.items():
        total_var = s["x_sq"] - s["x_sum"].pow(2).sum().item() / n_pos
        layers[layer] = {"l0": s["l0"] / n_pos, "explained_variance": 1.0 - s["sq_err"] / total_var}
    single = next(iter(layers.values())) if len(layers) == 1 else {}
    return {
        **single,
        **ce,
        "ce_loss_recovered": (ce["ce_zero"] - ce["ce_sae"]) / denom if denom != 0 else None,
        "layers": layers,
    }
