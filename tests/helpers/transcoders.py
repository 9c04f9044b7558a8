"""A model with its MLPs swapped for transcoders by replacing the block's MLP module: a
reference for the hooks sae.metrics.evaluate_transcoders splices them in with."""

from __future__ import annotations

import copy

import torch


class SwappedMLP(torch.nn.Module):
    """A block's MLP replaced by a transcoder (the real MLP kept at BOS, position 0, which the
    training rows excluded). The MLP gets ln2's output; the transcoder reads
    ln2.hook_normalized, before ln2's weight and bias, so those are undone here."""

    def __init__(self, tc, block):
        super().__init__()
        self.tc, self.mlp, self.ln = tc, block.mlp, block.ln2

    def forward(self, x):
        out = self.tc((x - self.ln.b) / self.ln.w)
        out[:, 0] = self.mlp(x)[:, 0]
        return out


@torch.no_grad()
def swapped_loss(model, transcoders: dict[int, object], tokens: torch.Tensor) -> float:
    """The mean next-token loss with each layer's MLP in `transcoders` swapped out."""
    swapped = copy.deepcopy(model)
    for layer, tc in transcoders.items():
        swapped.blocks[layer].mlp = SwappedMLP(tc, swapped.blocks[layer])
    return swapped(tokens, return_type="loss").item()


class ZeroedMLP(torch.nn.Module):
    """A block's MLP whose output is zero (the real MLP kept at BOS, as in SwappedMLP)."""

    def __init__(self, block):
        super().__init__()
        self.mlp = block.mlp

    def forward(self, x):
        out = self.mlp(x)
        kept = out[:, 0].clone()
        out = torch.zeros_like(out)
        out[:, 0] = kept
        return out


@torch.no_grad()
def zeroed_loss(model, layers, tokens: torch.Tensor) -> float:
    """The mean next-token loss with each of `layers`' MLP outputs zeroed."""
    zeroed = copy.deepcopy(model)
    for layer in layers:
        zeroed.blocks[layer].mlp = ZeroedMLP(zeroed.blocks[layer])
    return zeroed(tokens, return_type="loss").item()


@torch.no_grad()
def randomised(tc, g: torch.Generator):
    """`tc` with every parameter drawn from N(0, 0.3^2) by `g`, frozen, in eval mode."""
    for p in tc.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        p.requires_grad_(False)
    return tc.eval()


def random_transcoders(model, d_sae: int = 96, k: int = 6, seed: int = 0) -> dict[int, object]:
    """A TopK transcoder per layer of `model` with random weights (SAELens's classes, as the
    stage loads them): a graph's exactness must not depend on how good they are."""
    from sae_lens.saes.sae import SAEMetadata

    from circuitflow.nodes import hook_name, mlp_hook
    from circuitflow.sae.transcoder import TopKTranscoder, TopKTranscoderConfig

    g = torch.Generator().manual_seed(seed)
    d = model.cfg.d_model
    out = {}
    for layer in range(model.cfg.n_layers):
        meta = SAEMetadata(hook_name=hook_name("mlp_in", layer), hook_name_out=mlp_hook(layer))
        cfg = TopKTranscoderConfig(d_in=d, d_sae=d_sae, d_out=d, k=k, metadata=meta,
                                   apply_b_dec_to_input=False)  # fmt: skip
        tc = TopKTranscoder(cfg)
        out[layer] = randomised(tc, g)
    return out


class ReplacedMLP(torch.nn.Module):
    """A block's MLP replaced by its transcoder of the MLP's own input plus fixed error
    vectors [P, d] (the replacement model with its error nodes), BOS left to the real MLP."""

    def __init__(self, tc, block, error):
        super().__init__()
        self.swapped, self.error = SwappedMLP(tc, block), error

    def forward(self, x):
        out = self.swapped(x)
        out[:, 1:] = out[:, 1:] + self.error[1:]
        return out


@torch.no_grad()
def replaced_logits(model, transcoders, errors: dict[int, torch.Tensor], tokens) -> torch.Tensor:
    """The logits of `model` with every MLP in `transcoders` a ReplacedMLP (module swap)."""
    replaced = copy.deepcopy(model)
    for layer, tc in transcoders.items():
        block = replaced.blocks[layer]
        block.mlp = ReplacedMLP(tc, block, errors[layer])
    return replaced(tokens[None], return_type="logits")[0]


def random_skip_transcoders(model, d_sae: int = 96, seed: int = 1) -> dict[int, object]:
    """A skip transcoder per layer (SAELens's SkipTranscoder: ReLU features plus a linear skip
    path x W_skip^T, as Gemma Scope 2's affine transcoders), random weights."""
    from sae_lens import SkipTranscoder, SkipTranscoderConfig
    from sae_lens.saes.sae import SAEMetadata

    from circuitflow.nodes import hook_name, mlp_hook

    g = torch.Generator().manual_seed(seed)
    d = model.cfg.d_model
    out = {}
    for layer in range(model.cfg.n_layers):
        meta = SAEMetadata(hook_name=hook_name("mlp_in", layer), hook_name_out=mlp_hook(layer))
        tc = SkipTranscoder(SkipTranscoderConfig(d_in=d, d_sae=d_sae, d_out=d, metadata=meta,
                                                 apply_b_dec_to_input=False))  # fmt: skip
        out[layer] = randomised(tc, g)
    return out
