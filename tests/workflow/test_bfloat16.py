"""A bfloat16 run of the embedded model on CPU (bf16 works there): capture runs in bf16, but
every number a user reads is computed in float32, so the baseline, the SAEs' CE metrics and the
top heads match the float32 run (.test/config/small.yaml), and no loss falls on bfloat16's
1/128 grid (TransformerLens's own loss would, in the model's dtype)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from helpers.dag import load_test_config, place_model, read_json, run_snakemake

pytestmark = pytest.mark.slow
CE = ("ce_clean", "ce_sae", "ce_zero")


def on_grid(x: float, step: float = 1 / 128) -> bool:
    return abs(x / step - round(x / step)) < 1e-6


def test_bfloat16_model_measures_in_float32(small_results, tmp_path):
    config = load_test_config("small")
    config["model"] = {"dtype": "bfloat16"}
    bf16 = tmp_path / "results"
    # Neither train_model nor prompts reads model.dtype: the small run's model and prompts
    # (times kept) are what Snakemake would make again.
    place_model(small_results, config, bf16)
    shutil.copytree(small_results / "prompts", bf16 / "prompts")
    targets = [
        bf16 / "baseline" / "induction.json",
        bf16 / "saes" / "resid_post" / "layer_1",
        bf16 / "attribution" / "induction" / "heads.parquet",
    ]
    done = run_snakemake(config, tmp_path, *map(str, targets), prefork=True)
    assert "rule train_model:" not in done.stdout + done.stderr
    ours = read_json(bf16 / "saes" / "resid_post" / "layer_1" / "metrics.json")
    ref = read_json(small_results / "saes" / "resid_post" / "layer_1" / "metrics.json")
    for key in (*CE, "ce_loss_recovered"):
        assert ours[key] == pytest.approx(ref[key], abs=0.02), key
    assert not any(on_grid(ours[key]) for key in CE), {k: ours[k] for k in CE}
    # The activations were captured in bfloat16: the SAE differs, a little.
    assert ours["explained_variance"] != ref["explained_variance"]
    base, base_ref = (read_json(r / "baseline" / "induction.json") for r in (bf16, small_results))
    for key in ("logit_diff_mean", "corrupted_logit_diff_mean"):
        assert base[key] == pytest.approx(base_ref[key], abs=0.02), key
    assert not on_grid(base["logit_diff_mean"], 1 / 16)
    heads, heads_ref = (
        pd.read_parquet(r / "attribution" / "induction" / "heads.parquet")
        for r in (bf16, small_results)
    )
    top = [(r.layer, r.head) for r in heads.head(3).itertuples()]
    assert top == [(r.layer, r.head) for r in heads_ref.head(3).itertuples()]
