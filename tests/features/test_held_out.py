"""The held-out contexts the labels are scored on: a text corpus's are the contexts packed right
after the token set's (so no dictionary saw them), the embedded language's come from a stream
of their own; a corpus too short is refused naming features.held_out_tokens; and the held-out
examples a description is scored on are firing and quiet positions of each live feature."""

from __future__ import annotations

import numpy as np
import pytest

from circuitflow.capture import tokens as token_set
from circuitflow.capture.config import CaptureConfig
from circuitflow.features import held_out
from circuitflow.schema import schema_defaults


@pytest.fixture(scope="module")
def corpus_run(tiny_hf_model_dir, tmp_path_factory):
    """A local model's run over a small text corpus: its config, model.json's folder (the
    fields the tokenizer's loader reads), and the token set's meta."""
    import json

    root = tmp_path_factory.mktemp("held_out")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(f"line {i} of the corpus, with its own words {i * 7}"
                                for i in range(400)) + "\n")  # fmt: skip
    config = {
        "seed": 0,
        "model": {"name": str(tiny_hf_model_dir), "hf_cache": None, "dtype": "auto"},
        "capture": schema_defaults("capture")
        | {"corpus": str(corpus), "n_tokens": 310, "context_length": 32},
        "features": {"held_out_tokens": 93},
    }
    (root / "model").mkdir()
    (root / "model" / "model.json").write_text(json.dumps({
        "kind": "local_hf", "path": str(tiny_hf_model_dir), "architecture": {"n_ctx": 64},
        "weights_sha256": "-",
    }))  # fmt: skip
    tokens, meta = token_set.build_token_set(
        CaptureConfig.from_dict(config["capture"]), 0, root / "model"
    )
    return config, root / "model", tokens, meta


def test_a_corpus_gives_the_contexts_after_the_token_set(corpus_run):
    config, model_dir, tokens, meta = corpus_run
    held, held_meta = held_out.build(config, model_dir, meta)
    assert held.shape == (3, 32)  # 93 counted tokens, 31 a context
    assert held_meta["held_out_from"] == meta["token_set_hash"]
    # Packing the corpus once for both gives the token set's rows, then these.
    capture = CaptureConfig.from_dict(config["capture"])
    from circuitflow.model.load import load_tokenizer

    docs = token_set.corpus_documents(capture, meta["source"])
    both, _ = token_set.pack(docs, load_tokenizer(model_dir), len(tokens) + 3, 32, meta["source"])
    np.testing.assert_array_equal(both[: len(tokens)], tokens)
    np.testing.assert_array_equal(both[len(tokens) :], held)


def test_a_short_corpus_names_the_held_out_key(corpus_run):
    config, model_dir, _, meta = corpus_run
    config = {**config, "features": {**config["features"], "held_out_tokens": 10**7}}
    with pytest.raises(ValueError, match=r"^features\.held_out_tokens: corpus .* holds"):
        held_out.build(config, model_dir, meta)


def test_the_embedded_language_draws_its_own_stream():
    info = {"language": schema_defaults("embedded.language")}
    a, _ = token_set.synthetic_contexts(info, 0, 20, 32)
    b, _ = token_set.synthetic_contexts(info, 0, 20, 32, held_out.HELD_OUT_STREAM)
    again, _ = token_set.synthetic_contexts(info, 0, 20, 32, held_out.HELD_OUT_STREAM)
    np.testing.assert_array_equal(b, again)  # the seed fixes it
    assert not {tuple(r) for r in a} & {tuple(r) for r in b}


def test_examples_are_firing_and_quiet_positions_with_their_windows():
    rng = np.random.default_rng(0)
    held = rng.integers(0, 50, size=(10, 8))
    first, per = 1, 7
    acts = rng.random((10 * per, 4)) * (rng.random((10 * per, 4)) < 0.2)
    acts[:, 3] = 0  # live in the pass, never firing here
    pos, feat = np.nonzero(acts)
    live = np.array([True, True, False, True])
    ex = held_out.examples(pos, feat, acts[pos, feat], held, live, 3, (2, 1), first, 0)
    got = {(f, bool(fi)) for f, fi in zip(ex["feature"], ex["fires"], strict=True)}
    assert got == {(0, True), (0, False), (1, True), (1, False), (3, False)}
    for i in range(len(ex["feature"])):
        f, c, p = ex["feature"][i], ex["context"][i], ex["position"][i]
        value = acts[c * per + p - first, f]
        assert (value > 0) == ex["fires"][i] and np.isclose(value, ex["activation"][i])
        lo = ex["window_start"][i]
        np.testing.assert_array_equal(ex["tokens"][i], held[c, lo : lo + len(ex["tokens"][i])])
        assert lo >= first and ex["tokens"][i][ex["qualifying_index"][i]] == held[c, p]
    strongest = acts[:, 0].max()
    top = ex["activation"][(ex["feature"] == 0) & (ex["rank"] == 0) & ex["fires"]][0]
    assert np.isclose(top, strongest)
