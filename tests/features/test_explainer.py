"""The explainer slot with a language model of random weights (a tiny GPT-2 with a chat template,
built here): it writes nonsense, and its nonsense must score like its control (another
feature's description on the same held-out examples), which is the test that the detection
scorer gives no credit for free. (The workflow's explainer rules: tests/workflow/test_pipeline.py's
dry run.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from circuitflow.features import explainer

LIVE = 6  # features the tiny model explains (the rest of the dictionary marked dead)
CHAT = (
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def instruct_model(tiny_hf_model_dir, tmp_path_factory):
    """An instruct-shaped model of random weights: the tiny GPT-2's tokenizer with a chat
    template, 2 layers, room for long prompts."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out = tmp_path_factory.mktemp("instruct")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_hf_model_dir / name, out / name)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": CHAT}))
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=600, n_positions=1024, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def explained(default_results, instruct_model, tmp_path_factory):
    """resid_post layer 0's folder of the default run with LIVE live features, explained."""
    root = tmp_path_factory.mktemp("explained")
    source = default_results / "features" / "resid_post" / "layer_0"
    folder = root / "in" / "resid_post" / "layer_0"
    folder.mkdir(parents=True)
    feats = pd.read_parquet(source / "features.parquet")
    examples = pd.read_parquet(source / "examples.parquet")
    firing = examples[examples["fires"]].groupby("feature").size()
    keep = firing.index[firing == 10].to_numpy()[:LIVE]  # live, and firing on held-out tokens
    feats["dead"] = ~feats["feature"].isin(keep)
    feats.to_parquet(folder / "features.parquet")
    for name in ("contexts.parquet", "examples.parquet"):
        table = pd.read_parquet(source / name)
        table[table["feature"].isin(keep)].to_parquet(folder / name)
    shutil.copy(source / "summary.json", folder / "summary.json")
    record = root / "explainer.json"
    record.write_text(json.dumps({"kind": "local_hf", "path": str(instruct_model)}))
    config = {
        "seed": 0, "device": "cpu",
        "features": {"labeller": str(instruct_model),
                     "explainer": {"contexts": 4, "max_new_tokens": 4, "examples": 10,
                                   "batch_size": 40, "checkpoint_features": 4}},
    }  # fmt: skip
    out = root / "out" / "resid_post" / "layer_0"
    [summary] = explainer.run(config, record, [folder], [out], root / "ckpt", progress=False)
    return summary, pd.read_parquet(out / "features.parquet"), keep


def test_nonsense_descriptions_score_like_the_control(explained):
    summary, feats, keep = explained
    block = summary["labels"]["labellers"]["explainer"]
    assert block["n_live"] == LIVE
    assert abs(block["mean_f1"] - block["control"]["mean_f1"]) <= 0.05, block
    rows = feats.set_index("feature").loc[keep]
    assert (rows["label_explainer"].str.len() > 0).all()
    # Every live feature's examples were asked about: 10 firing and 10 quiet each.
    assert (rows["label_explainer_firing"] + rows["label_explainer_quiet"] == 20).all()
    # A label that predicts nothing is not shown over the rules that do.
    assert summary["labels"]["shown"] == "rules" and (feats["labeller"] == "rules").all()
    np.testing.assert_array_less(rows["label_explainer_f1"], rows["label_rules_f1"] + 0.2)
