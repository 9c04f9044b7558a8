"""The baseline stage's scores and its counted cost."""

from __future__ import annotations

import pandas as pd
import pytest
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuitflow import baseline


def test_forward_passes_counted_per_prompt():
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=8, d_vocab=20,
        act_fn="gelu", normalization_type="LN", seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg).eval()
    # Two lengths: batches never mix them, and a batch of B prompts counts B forwards.
    clean = [[0, 1, 2, 3]] * 5 + [[0, 4, 5]] * 2
    prompts = pd.DataFrame(
        {
            "prompt_id": range(7),
            "clean_tokens": clean,
            "corrupted_tokens": [[0, 6, *t[2:]] for t in clean],
            "answer_id": [7] * 7,
            "distractor_id": [8] * 7,
        }
    )
    summary, _scores, _table = baseline.score(model, prompts, baseline.BaselineConfig(batch_size=2))
    assert summary["forward_equivalents_per_prompt"] == pytest.approx(2.0)
    assert summary["forward_equivalents_by_part"] == {"clean": 1.0, "corrupted": 1.0}
    assert summary["forward_equivalents_total"] == 14
    assert summary["forward_equivalents_unit"] == "prompt"
