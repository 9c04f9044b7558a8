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
