"""The labels' held-out scores on the embedded default (`default_results`), recomputed by a path
of their own: the held-out contexts (activations/held_out_tokens.npy) through the model, each
dictionary's activations from SAELens's `encode`, and a sample of labels read back from their
text and checked token by token in plain Python. Then the issue's targets: every live feature
scored, each control's mean F1 at most 0.05, the `rules` labeller above `tokens` everywhere."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.slow

SAMPLE = 24  # labels recomputed per dictionary
DICTIONARIES = [("resid_post", 0), ("mlp_out", 0), ("resid_post", 1), ("mlp_out", 1)]
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def parse(label: str, vocab: dict[str, int]):
    """(kind, tokens, condition) of a label's words, read as a person would: `fires on "a" /
    "b"`, `fires after "a"`, `fires before "a"`, `fires on any token`, then a condition (the
    `(strongest on "x")` aside and what it promotes are not the rule)."""
    rule = re.sub(r' \(strongest on "(?:[^"\\]|\\.)*"\)', "", label.split("; promotes ")[0])
    m = re.match(r"fires (on any token|on|after|before)(.*)$", rule)
    kind, rest = m.group(1), m.group(2)
    tokens = {vocab[t] for t in QUOTED.findall(rest)}
    condition = QUOTED.sub("", rest).replace("/", "").strip()
    return kind, tokens, condition


def flags(ctx: list[int]) -> list[tuple[bool, bool]]:
    """Per position: its token occurred earlier in the context; its bigram did."""
    out, seen, bigrams = [], set(), set()
    for j, tok in enumerate(ctx):
        bigram = (ctx[j - 1], tok) if j else None
        out.append((tok in seen, bigram in bigrams))
        seen.add(tok)
        bigrams.add(bigram)
    return out


def holds(kind: str, tokens: set, condition: str, ctx: list[int], j: int, flag) -> bool:
    repeated, segment = flag[j]
    if condition == "when repeated in its context" and not repeated:
        return False
    if condition == "the first time in its context" and repeated:
        return False
    if condition == "in a repeated segment" and not segment:
        return False
    if condition == "outside repeated segments" and segment:
        return False
    if m := re.match(r"at positions (<=|>) (\d+)$", condition):
        q = int(m.group(2))
        if (j <= q) != (m.group(1) == "<="):
            return False
    if kind == "on any token":
        return True
    at = {"on": j, "after": j - 1, "before": j + 1}[kind]
    return 0 <= at < len(ctx) and ctx[at] in tokens


@pytest.fixture(scope="module")
def recomputed(default_results):
    """Per dictionary, the sample's F1 recomputed and as the stage wrote it."""
    from sae_lens import SAE

    import circuitflow.sae.transcoder  # noqa: F401 - registers the TopK transcoder with SAELens
    from circuitflow.model.load import load_model

    held = np.load(default_results / "activations" / "held_out_tokens.npy")
    model = load_model(default_results / "model", "cpu", "float32")
    words = json.loads((default_results / "model" / "tokenizer" / "tokenizer.json").read_text())
    vocab = words["model"]["vocab"]
    out = {}
    for site, layer in DICTIONARIES:
        folder = default_results / "features" / site / f"layer_{layer}"
        feats = pd.read_parquet(folder / "features.parquet").set_index("feature")
        summary = json.loads((folder / "summary.json").read_text())
        sae = SAE.load_from_disk(str(default_results / "saes" / site / f"layer_{layer}"))
        hook = sae.cfg.metadata.hook_name
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.from_numpy(held.astype(np.int64)),
                                            names_filter=[hook])  # fmt: skip
            fires = (sae.encode(cache[hook]) > 0).numpy()
        live = feats.index[~feats["dead"]].to_numpy()
        sample = np.random.default_rng(layer).choice(live, SAMPLE, replace=False)
        first = summary["first_position"]
        mine, theirs = [], []
        contexts = held.tolist()
        per_context = [flags(ctx) for ctx in contexts]
        for f in sample:
            rule = parse(feats.at[f, "label"], vocab)
            tp = fp = fn = 0
            for c, ctx in enumerate(contexts):
                for j in range(first, len(ctx)):
                    said = holds(*rule, ctx, j, per_context[c])
                    fired = bool(fires[c, j, f])
                    tp, fp, fn = (
                        tp + (said and fired),
                        fp + (said and not fired),
                        fn + (fired and not said),
                    )
            mine.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
            theirs.append(feats.at[f, "label_f1"])
        out[(site, layer)] = (np.array(mine), np.array(theirs), summary)
    return out


def test_scores_agree_with_an_independent_recomputation(recomputed):
    for key, (mine, theirs, _) in recomputed.items():
        gap = np.abs(mine - theirs)
        assert gap.mean() <= 0.02, (key, list(zip(mine.round(3), theirs.round(3), strict=True)))


def test_every_live_feature_scored_and_controls_at_chance(recomputed):
    for key, (_, _, summary) in recomputed.items():
        labels = summary["labels"]
        assert labels["held_out_tokens"] >= 16384, key
        for name, block in labels["labellers"].items():
            assert block["n_scored"] == block["n_live"] > 0, (key, name)
            assert block["control"]["mean_f1"] <= 0.05, (key, name, block["control"])
        rules, tokens = labels["labellers"]["rules"], labels["labellers"]["tokens"]
        assert rules["mean_f1"] > tokens["mean_f1"], (key, rules["mean_f1"], tokens["mean_f1"])
        assert labels["shown"] == "rules"
