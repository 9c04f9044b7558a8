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
