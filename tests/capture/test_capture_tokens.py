"""The capture token set: synthetic (embedded) and packed local text corpora (real models)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from circuitflow.capture import tokens as corpus
from circuitflow.capture.config import CaptureConfig
from circuitflow.model.language import LanguageConfig, SyntheticLanguage

CAPTURE = CaptureConfig(n_tokens=600, context_length=16)
EMBEDDED_INFO = {
    "kind": "embedded",
    "architecture": {"n_ctx": 32},
    "language": {"n_random_tokens": 64, "n_subjects": 24, "n_attributes": 12,
                 "induction_share": 0.6, "seed": 0},
    "weights_sha256": "w",
}  # fmt: skip


def test_synthetic_is_seeded_and_separate_from_training():
    a, bos = corpus.synthetic_contexts(EMBEDDED_INFO, 0, 1100, 32)
    b, _ = corpus.synthetic_contexts(EMBEDDED_INFO, 0, 1100, 32)
    c, _ = corpus.synthetic_contexts(EMBEDDED_INFO, 1, 1100, 32)
    assert a.dtype == np.int32 and a.shape == (1100, 32) and (a[:, 0] == bos).all()
    assert corpus.token_set_hash(a) == corpus.token_set_hash(b) != corpus.token_set_hash(c)
    # Not the training stream (seed, 2): the first training batch differs.
    lang = SyntheticLanguage(LanguageConfig(**EMBEDDED_INFO["language"]))
    train = lang.batch(np.random.default_rng([0, 2]), 4, 32)
    assert not np.array_equal(train, a[:4])


def test_context_and_token_counts():
    assert corpus.n_contexts_for(600, 16, True) == 40
    assert corpus.n_contexts_for(600, 16, False) == 38
    assert corpus.context_length_for(CaptureConfig(), EMBEDDED_INFO) == 32
    real = {"kind": "local_hf", "architecture": {"n_ctx": 1024}}
    assert corpus.context_length_for(CaptureConfig(), real) == 128
    with pytest.raises(ValueError, match="capture.context_length"):
        corpus.context_length_for(CaptureConfig(context_length=64), EMBEDDED_INFO)
    with pytest.raises(ValueError, match="capture.corpus"):
        corpus.corpus_source(CaptureConfig(), real)


@pytest.fixture
def local_model(tiny_hf_model_dir, tmp_path):
    """A model.json describing the tiny Hugging Face model directory."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    info = {"kind": "local_hf", "path": str(tiny_hf_model_dir), "architecture": {"n_ctx": 64},
            "weights_sha256": "abc"}  # fmt: skip
    (model_dir / "model.json").write_text(json.dumps(info))
    return model_dir


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "parquet"])
def test_local_corpus_is_tokenized_and_packed_with_bos(local_model, tmp_path, fmt):
    from transformers import AutoTokenizer

    docs = [f"The capital of France is the city of Paris {i}" for i in range(60)]
    path = tmp_path / f"corpus.{fmt}"
    if fmt == "txt":
        path.write_text("\n".join(docs) + "\n")
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    else:
        import pandas as pd

        pd.DataFrame({"text": docs}).to_parquet(path)
    toks, meta = corpus.build_token_set(replace(CAPTURE, corpus=str(path)), 0, local_model)
    tok = AutoTokenizer.from_pretrained(
        json.loads((local_model / "model.json").read_text())["path"]
    )
    assert toks.shape == (40, 16) and meta["context_length"] == 16
    assert (toks[:, 0] == tok.bos_token_id).all() and meta["bos_token_id"] == tok.bos_token_id
    stream = []
    for d in docs:
        stream += [*tok(d, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    np.testing.assert_array_equal(toks[:, 1:].reshape(-1), stream[: 40 * 15])
    assert meta["token_set_hash"] == corpus.token_set_hash(toks)
    assert meta["model_hash"] == "abc"


def test_too_small_corpus_fails_clearly(local_model, tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("The capital of France\n")
    with pytest.raises(ValueError, match="capture.n_tokens: corpus .* has only"):
        corpus.build_token_set(replace(CAPTURE, corpus=str(path)), 0, local_model)


def test_token_set_round_trip(tmp_path):
    toks, _ = corpus.synthetic_contexts(EMBEDDED_INFO, 0, 10, 32)
    meta = {"n_contexts": 10, "context_length": 32, "token_set_hash": corpus.token_set_hash(toks)}
    corpus.write_token_set(toks, meta, tmp_path / "t.npy", tmp_path / "t.json")
    back, meta2 = corpus.read_token_set(tmp_path / "t.npy", tmp_path / "t.json")
    assert meta2 == meta and np.array_equal(back, toks)
