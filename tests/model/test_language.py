"""The synthetic language and the behaviour prompts built from it."""

from __future__ import annotations

import numpy as np

from circuitflow.model.language import (
    REPEAT_LENGTH,
    SEGMENT_LENGTH,
    LanguageConfig,
    SyntheticLanguage,
)


def test_facts_are_a_fixed_function_of_the_seed():
    a, b = SyntheticLanguage(LanguageConfig(seed=3)), SyntheticLanguage(LanguageConfig(seed=3))
    assert a.fact_of == b.fact_of
    assert a.fact_of != SyntheticLanguage(LanguageConfig(seed=4)).fact_of
    assert set(a.fact_of.values()) == set(a.attribute_ids.tolist())  # every attribute used


def test_induction_prompts_repeat_the_segment_and_corrupt_the_first_copy():
    lang = SyntheticLanguage(LanguageConfig())
    for p in lang.induction_prompts(np.random.default_rng(0), 20):
        segment = p.clean[1 : 1 + SEGMENT_LENGTH]
        assert p.clean[1 + SEGMENT_LENGTH :] == segment[:REPEAT_LENGTH]
        assert p.answer == segment[REPEAT_LENGTH]
        assert len(p.corrupted) == len(p.clean)
        assert p.corrupted[1 + SEGMENT_LENGTH :] == p.clean[1 + SEGMENT_LENGTH :]
        assert p.answer not in p.corrupted[1 : 1 + SEGMENT_LENGTH]
        assert p.distractor == p.corrupted[1 + REPEAT_LENGTH]


def test_facts_prompts_differ_only_in_the_subject():
    lang = SyntheticLanguage(LanguageConfig())
    for p in lang.facts_prompts(np.random.default_rng(0), 20):
        assert p.clean[:-1] == p.corrupted[:-1]
        assert p.answer == lang.fact_of[p.clean[-1]]
        assert p.distractor == lang.fact_of[p.corrupted[-1]] != p.answer


def test_documents_contain_both_behaviours_and_fit_the_context():
    lang = SyntheticLanguage(LanguageConfig())
    batch = lang.batch(np.random.default_rng(1), 64, 32)
    assert batch.shape == (64, 32) and (batch[:, 0] == lang.bos_id).all()
    has_subject = np.isin(batch, lang.subject_ids).any(axis=1)
    assert 0.2 < has_subject.mean() < 0.8


def test_tokenizer_round_trips_words():
    lang = SyntheticLanguage(LanguageConfig())
    ids = [lang.bos_id, 5, int(lang.subject_ids[2]), lang.fact_of[int(lang.subject_ids[2])]]
    text = lang.decode(ids[1:])
    assert lang.tokenizer.encode(text, add_special_tokens=False) == ids[1:]
