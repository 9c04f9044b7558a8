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


def test_a_constant_metric_is_scored_and_plotted(tmp_path, monkeypatch):
    """A model whose logits do not depend on the input (W_U = 0, b_U = 0) on prompts whose
    corrupted tokens are the clean ones: the logit difference is 0 for every prompt, clean and
    corrupted; the stage's summary is strict JSON with its spread 0 and the figure is drawn."""
    import json

    import torch

    from circuitflow.io import write_json
    from circuitflow.report.pages.baseline import baseline_table

    cfg = HookedTransformerConfig(
        n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=8, d_vocab=20,
        act_fn="gelu", normalization_type="LN", seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg).eval()
    with torch.no_grad():
        model.W_U.zero_()
    clean = [[0, 1, 2, 3], [0, 4, 5, 6], [0, 7, 8, 9]]
    prompts = pd.DataFrame({"prompt_id": range(3), "clean_tokens": clean,
                            "corrupted_tokens": clean, "answer_id": [7, 8, 9],
                            "distractor_id": [10, 11, 12]})  # fmt: skip
    summary, scores, table = baseline.score(model, prompts)
    assert (scores["logit_diff"] == 0).all() and (scores["corrupted_logit_diff"] == 0).all()
    assert summary["logit_diff_std"] == 0.0 and summary["accuracy"] == 0.0
    written = summary | {"behaviour": "b", "calibration": baseline.json_records(table)}
    write_json(tmp_path / "b.json", written)
    json.loads((tmp_path / "b.json").read_text(), parse_constant=pytest.fail)
    baseline.plot(scores, table, "constant").savefig(tmp_path / "b.png")
    row = baseline_table([tmp_path / "b.json"]).iloc[0]  # the report's baseline page
    assert (row["logit_diff_mean"], row["corrupted_logit_diff_mean"]) == (0, 0)
