"""The embedded default, end to end: the behaviours it was built to have are really there."""

from __future__ import annotations

from conftest import read_json


def test_default_model_reaches_the_baseline_accuracy(default_results):
    assert read_json(default_results / "model" / "model.json")["eval_loss"] < 3.5
    for behaviour in ("induction", "facts"):
        summary = read_json(default_results / "baseline" / f"{behaviour}.json")
        assert summary["n_prompts"] == 256
        assert summary["accuracy"] >= 0.95, (behaviour, summary["accuracy"])
        assert summary["logit_diff_mean"] > 1.0
        # Corrupting the prompt removes the information the answer depends on.
        assert summary["corrupted_logit_diff_mean"] < summary["logit_diff_mean"] - 1.0
