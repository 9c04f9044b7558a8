"""The synthetic language the embedded default model learns.

Two behaviours with known mechanisms live in it:

* induction: documents repeat random segments, so predicting the second occurrence needs a
  previous-token head and an induction head;
* facts: fixed subject -> attribute pairs ("s3 a7"), memorised, so predicting an attribute only
  needs the subject token itself (embedding and MLP path, no attention).

Words are `<bos>`, `r0..`, `s0..`, `a0..`, so prompts have readable text and a real word-level
tokenizer, like a real model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from circuitflow.schema import schema_defaults

BOS = "<bos>"
UNK = "<unk>"
SEGMENT_LENGTH = 12  # induction prompt: BOS + segment + first REPEAT_LENGTH tokens of it again
REPEAT_LENGTH = 6
FACT_PREFIX_LENGTH = 6  # facts prompt: BOS + random filler + subject
MIN_CONTEXT = 1 + SEGMENT_LENGTH + REPEAT_LENGTH


_D = schema_defaults("embedded.language")


@dataclass(frozen=True)
class LanguageConfig:
    """`embedded.language` (defaults: the schema's) and the master seed it is drawn with."""

    n_random_tokens: int = _D["n_random_tokens"]
    n_subjects: int = _D["n_subjects"]
    n_attributes: int = _D["n_attributes"]
    induction_share: float = _D["induction_share"]
    seed: int = schema_defaults()["seed"]


@dataclass
class Prompt:
    clean: list[int]
    corrupted: list[int]
    answer: int
    distractor: int


class SyntheticLanguage:
    def __init__(self, cfg: LanguageConfig):
        self.cfg = cfg
        self.words = (
            [BOS]
            + [f"r{i}" for i in range(cfg.n_random_tokens)]
            + [f"s{i}" for i in range(cfg.n_subjects)]
            + [f"a{i}" for i in range(cfg.n_attributes)]
            + [UNK]
        )
        self.bos_id = 0
        self.random_ids = np.arange(1, 1 + cfg.n_random_tokens)
        self.subject_ids = self.random_ids[-1] + 1 + np.arange(cfg.n_subjects)
        self.attribute_ids = self.subject_ids[-1] + 1 + np.arange(cfg.n_attributes)
        # Every attribute is used, each by about the same number of subjects.
        rng = np.random.default_rng([cfg.seed, 1])
        assignment = rng.permutation(np.arange(cfg.n_subjects) % cfg.n_attributes)
        self.fact_of = dict(
            zip(self.subject_ids.tolist(), self.attribute_ids[assignment].tolist(), strict=True)
        )

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids)

    # --- training documents -------------------------------------------------------------------
    def document(self, rng: np.random.Generator, n_ctx: int) -> list[int]:
        # ids[rng.integers(0, len(ids), size)] draws what rng.choice(ids, size) draws, from the
        # same stream, at a sixth of its overhead (model training makes 160k documents).
        tokens = [self.bos_id]
        n_random, n_subjects = len(self.random_ids), len(self.subject_ids)
        if rng.random() < self.cfg.induction_share:
            while len(tokens) < n_ctx:
                segment = rng.choice(self.random_ids, size=int(rng.integers(6, 17)), replace=False)
                for _ in range(int(rng.integers(2, 4))):
                    filler = rng.integers(0, n_random, size=int(rng.integers(0, 6)))
                    tokens += self.random_ids[filler].tolist()
                    tokens += segment.tolist()
        else:
            while len(tokens) < n_ctx:
                if rng.random() < 0.3:
                    tokens.append(int(self.random_ids[rng.integers(0, n_random)]))
                else:
                    subject = int(self.subject_ids[rng.integers(0, n_subjects)])
                    tokens += [subject, self.fact_of[subject]]
        return tokens[:n_ctx]

    def batch(self, rng: np.random.Generator, batch_size: int, n_ctx: int) -> np.ndarray:
        return np.array([self.document(rng, n_ctx) for _ in range(batch_size)], dtype=np.int64)

    # --- behaviour prompts --------------------------------------------------------------------
    def induction_prompts(self, rng: np.random.Generator, n: int) -> list[Prompt]:
        """Clean: BOS A A[:6] -> A[6]. Corrupted: BOS B A[:6], whose first half no longer holds
        the continuation, so induction has nothing to copy. Distractor: B[6]."""
        prompts = []
        for _ in range(n):
            a = rng.choice(self.random_ids, size=SEGMENT_LENGTH, replace=False)
            b = rng.choice(np.setdiff1d(self.random_ids, a), size=SEGMENT_LENGTH, replace=False)
            repeat = a[:REPEAT_LENGTH].tolist()
            prompts.append(
                Prompt(
                    clean=[self.bos_id, *a.tolist(), *repeat],
                    corrupted=[self.bos_id, *b.tolist(), *repeat],
                    answer=int(a[REPEAT_LENGTH]),
                    distractor=int(b[REPEAT_LENGTH]),
                )
            )
        return prompts

    def facts_prompts(self, rng: np.random.Generator, n: int) -> list[Prompt]:
        """Clean: BOS filler s -> fact(s). Corrupted: the same filler, another subject s' whose
        attribute differs; the distractor is fact(s')."""
        prompts = []
        for _ in range(n):
            subject = int(rng.choice(self.subject_ids))
            others = [
                s for s in self.subject_ids.tolist() if self.fact_of[s] != self.fact_of[subject]
            ]
            other = int(rng.choice(others))
            filler = rng.choice(self.random_ids, size=FACT_PREFIX_LENGTH, replace=False).tolist()
            prompts.append(
                Prompt(
                    clean=[self.bos_id, *filler, subject],
                    corrupted=[self.bos_id, *filler, other],
                    answer=self.fact_of[subject],
                    distractor=self.fact_of[other],
                )
            )
        return prompts

    # --- tokenizer ----------------------------------------------------------------------------
    @cached_property
    def tokenizer(self):
        """A Hugging Face fast tokenizer for the language (word level, whitespace split)."""
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(self.words)}, unk_token=UNK))
        core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        # BOS doubles as EOS and padding, as in GPT-2, so no token exists that the model never saw.
        return PreTrainedTokenizerFast(
            tokenizer_object=core, bos_token=BOS, eos_token=BOS, pad_token=BOS, unk_token=UNK
        )
