"""The behaviour metric every stage measures, in one place, in float32.

m = logit(answer) - logit(distractor) at the last position, per prompt. The logits are cast to
float32 before the difference: in a bfloat16 model two logits near 10 are 1/16 apart at best.
"""

from __future__ import annotations

import torch


def logit_diff(
    logits: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor
) -> torch.Tensor:
    """Per-prompt metric [b] (float32): answer minus distractor logit at the last position."""
    last = logits[:, -1].float()
    rows = torch.arange(len(answer), device=last.device)
    return last[rows, answer] - last[rows, distractor]


def next_token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy [b, p - 1] of predicting tokens[:, 1:], from float32 logits (as
    TransformerLens's `return_type="loss"`, which works in the model's dtype: bfloat16 losses
    fall on a 1/128 grid once averaged)."""
    logp = logits[:, :-1].float().log_softmax(-1)
    return -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
