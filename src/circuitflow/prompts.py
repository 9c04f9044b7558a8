"""The prompts stage: each behaviour's prompt set, with an answer, a distractor and a corrupted
twin for patching.

Every source (the `SOURCES` registry: one entry per `behaviours.<name>.source`) yields rows with
the same columns (`PROMPT_COLUMNS`); the clean and corrupted token lists of a row always have the
same length, so later stages can patch position by position.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from circuitflow.errors import ConfigError, InputError
from circuitflow.io import write_parquet
from circuitflow.model.language import LanguageConfig, SyntheticLanguage
from circuitflow.schema import schema_defaults, typed

PROMPT_COLUMNS = [
    "prompt_id",
    "clean_tokens",
    "corrupted_tokens",
    "answer_id",
    "distractor_id",
    "clean_text",
    "corrupted_text",
    "answer_text",
    "distractor_text",
]

# Templates and names after Wang et al. (2022), "Interpretability in the Wild" (IOI), BABA form.
IOI_TEMPLATES = [
    "Then, {B} and {A} went to the {PLACE}. {B} gave a {OBJECT} to",
    "Then, {B} and {A} had a lot of fun at the {PLACE}. {B} gave a {OBJECT} to",
    "Then, {B} and {A} were working at the {PLACE}. {B} decided to give a {OBJECT} to",
    "Then, {B} and {A} were thinking about going to the {PLACE}. {B} wanted to give a {OBJECT} to",
    "Then, {B} and {A} had a long argument, and afterwards {B} said to",
    "After {B} and {A} went to the {PLACE}, {B} gave a {OBJECT} to",
    "When {B} and {A} got a {OBJECT} at the {PLACE}, {B} decided to give it to",
    "When {B} and {A} got a {OBJECT} at the {PLACE}, {B} decided to give the {OBJECT} to",
    "While {B} and {A} were working at the {PLACE}, {B} gave a {OBJECT} to",
    "While {B} and {A} were commuting to the {PLACE}, {B} gave a {OBJECT} to",
    "After the lunch, {B} and {A} went to the {PLACE}. {B} gave a {OBJECT} to",
    "Afterwards, {B} and {A} went to the {PLACE}. {B} gave a {OBJECT} to",
    "Then, {B} and {A} had a long argument. Afterwards {B} said to",
    "The {PLACE} {B} and {A} went to had a {OBJECT}. {B} gave it to",
    "Friends {B} and {A} found a {OBJECT} at the {PLACE}. {B} gave it to",
]
IOI_NAMES = (
    "Michael Christopher Jessica Matthew Ashley Jennifer Joshua Amanda Daniel David James "
    "Robert John Joseph Andrew Ryan Brandon Jason Justin Sarah William Jonathan Stephanie "
    "Brian Nicole Nicholas Anthony Heather Eric Elizabeth Adam Megan Melissa Kevin Steven "
    "Thomas Timothy Christina Kyle Rachel Laura Lauren Amber Brittany Danielle Richard "
    "Kimberly Jeffrey Amy Crystal Michelle Tiffany Jeremy Benjamin Mark Emily Aaron Charles "
    "Rebecca Jacob Stephen Patrick Sean Erin Jamie Kelly Samantha Nathan Sara Dustin Paul "
    "Angela Tyler Scott Katherine Andrea Gregory Erica Mary Travis Lisa Kenneth Bryan Lindsey "
    "Kristen Jose Alexander Jesse Katie Lindsay Shannon Vanessa Courtney Christine Alicia "
    "Cody Allison Bradley Samuel "
).split()
IOI_PLACES = ["store", "garden", "restaurant", "school", "hospital", "office", "house", "station"]
IOI_OBJECTS = ["ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack"]

# A small factual-recall set for real models: the capital of each country.
CAPITALS = dict(
    pair.split(":")
    for pair in (
        "France:Paris Italy:Rome Spain:Madrid Germany:Berlin Japan:Tokyo Russia:Moscow "
        "Egypt:Cairo Greece:Athens Austria:Vienna Ireland:Dublin Poland:Warsaw Portugal:Lisbon "
        "Norway:Oslo Sweden:Stockholm Canada:Ottawa Kenya:Nairobi Peru:Lima Cuba:Havana "
        "Thailand:Bangkok China:Beijing "
    ).split()
)
CAPITAL_TEMPLATE = "The capital of {country} is the city of"


def behaviour_rng(seed: int, name: str) -> np.random.Generator:
    """A generator per behaviour, stable across Python runs (no `hash()` randomisation)."""
    salt = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    return np.random.default_rng([seed, salt])


def prompts_hash(frame: pd.DataFrame) -> str:
    """Content hash of a prompt set: tokens, answers and distractors, independent of file format."""
    payload = [
        [
            list(map(int, r.clean_tokens)),
            list(map(int, r.corrupted_tokens)),
            int(r.answer_id),
            int(r.distractor_id),
        ]
        for r in frame.itertuples()
    ]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


class Encoder:
    """Text <-> token ids with the model's tokenizer, BOS prepended as TransformerLens does."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        bos = tokenizer.bos_token_id
        self.bos_id = bos if bos is not None else tokenizer.eos_token_id

    def prompt(self, text: str) -> list[int]:
        return [self.bos_id, *self.tokenizer.encode(text, add_special_tokens=False)]

    def single(self, text: str) -> int | None:
        """The id of `text` if it is one token, else None."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def one(self, text: str, what: str) -> int:
        """The id of `text`, which must be exactly one known token; otherwise a ConfigError that
        says what `text` is (`what`, e.g. "row 3: answer"), how many tokens it makes and which."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1 and not self._unknown(ids[0], text):
            return ids[0]
        if not ids:
            why = "encodes to no tokens"
        elif len(ids) == 1:
            why = f"is not in the model's vocabulary (it encodes to {self.tokenizer.unk_token!r})"
        else:
            pieces = " + ".join(repr(self.tokenizer.decode([i])) for i in ids)
            why = f"is {len(ids)} tokens ({pieces})"
        raise ConfigError(f"{what} {text!r} {why}; it must be one token of the model's tokenizer")

    def _unknown(self, token_id: int, text: str) -> bool:
        """`token_id` is the tokenizer's unknown token, and `text` is not that token's own
        spelling (GPT-2's unk_token is <|endoftext|>, which no ordinary text encodes to)."""
        unk = self.tokenizer.unk_token_id
        return unk is not None and token_id == unk and text.strip() != self.tokenizer.unk_token

    def first(self, text: str) -> int:
        """The first token of `text`. Only factual_recall uses it, on purpose: a capital that
        splits into pieces (' Stockholm') is scored on its first piece, the model's next token.
        User files do not get this: `one` refuses a multi-token answer."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError(f"{text!r} encodes to no tokens")
        return ids[0]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


def _rows(clean, corrupted, answers, distractors, encoder: Encoder | None) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "prompt_id": np.arange(len(clean)),
            "clean_tokens": [list(map(int, c)) for c in clean],
            "corrupted_tokens": [list(map(int, c)) for c in corrupted],
            "answer_id": np.asarray(answers, dtype=np.int64),
            "distractor_id": np.asarray(distractors, dtype=np.int64),
        }
    )
    if encoder is not None:
        frame["clean_text"] = [encoder.decode(c[1:]) for c in frame.clean_tokens]
        frame["corrupted_text"] = [encoder.decode(c[1:]) for c in frame.corrupted_tokens]
        frame["answer_text"] = [encoder.decode([a]) for a in frame.answer_id]
        frame["distractor_text"] = [encoder.decode([d]) for d in frame.distractor_id]
    else:
        for column in PROMPT_COLUMNS[5:]:
            frame[column] = None
    return frame[PROMPT_COLUMNS]


def synthetic_prompts(source: str, language: SyntheticLanguage, rng, n: int) -> pd.DataFrame:
    make = {"induction": language.induction_prompts, "facts": language.facts_prompts}[source]
    prompts = make(rng, n)
    encoder = Encoder(language.tokenizer)
    return _rows(
        [p.clean for p in prompts],
        [p.corrupted for p in prompts],
        [p.answer for p in prompts],
        [p.distractor for p in prompts],
        encoder,
    )


def ioi_prompts(encoder: Encoder, rng, n: int) -> pd.DataFrame:
    """IOI (BABA): the answer is the indirect object A, the distractor the subject B. The
    corrupted prompt replaces the second mention of B by a third name C (the ABC dataset)."""
    names = [name for name in IOI_NAMES if encoder.single(" " + name) is not None]
    if len(names) < 3:
        raise ConfigError("behaviours: ioi needs names that are single tokens for this tokenizer")
    clean, corrupted, answers, distractors = [], [], [], []
    for _ in range(n):
        template = IOI_TEMPLATES[int(rng.integers(len(IOI_TEMPLATES)))]
        a, b, c = rng.choice(names, size=3, replace=False)
        fill = dict(PLACE=rng.choice(IOI_PLACES), OBJECT=rng.choice(IOI_OBJECTS))
        first, _, rest = template.partition("{B}")  # the first mention of B stays in both prompts
        clean_text = first + b + rest.format(A=a, B=b, **fill)
        corrupt_text = first + b + rest.format(A=a, B=c, **fill)
        clean_ids, corrupt_ids = encoder.prompt(clean_text), encoder.prompt(corrupt_text)
        if len(clean_ids) != len(corrupt_ids):
            continue
        clean.append(clean_ids)
        corrupted.append(corrupt_ids)
        answers.append(encoder.single(" " + a))
        distractors.append(encoder.single(" " + b))
    return _rows(clean, corrupted, answers, distractors, encoder)


def factual_recall_prompts(encoder: Encoder, rng, n: int) -> pd.DataFrame:
    """Capitals: the corrupted prompt names another country of the same token length; its
    capital is the distractor."""
    facts = []
    for country, capital in CAPITALS.items():
        ids = encoder.prompt(CAPITAL_TEMPLATE.format(country=country))
        facts.append((country, ids, encoder.first(" " + capital)))
    clean, corrupted, answers, distractors = [], [], [], []
    for _ in range(n):
        country, ids, answer = facts[int(rng.integers(len(facts)))]
        twins = [f for f in facts if len(f[1]) == len(ids) and f[2] != answer]
        if not twins:
            continue
        _, other_ids, other_answer = twins[int(rng.integers(len(twins)))]
        clean.append(ids)
        corrupted.append(other_ids)
        answers.append(answer)
        distractors.append(other_answer)
    if not clean:
        raise ConfigError("behaviours: factual_recall found no prompt pairs of equal token length")
    return _rows(clean, corrupted, answers, distractors, encoder)


PROMPT_FILE_COLUMNS = ("prompt", "answer", "distractor")  # required; corrupted_prompt optional
PROMPT_FILE_SUFFIXES = (".csv", ".jsonl", ".json")  # .json is read as JSON Lines too


def _read_table(path: Path) -> pd.DataFrame:
    """The file's rows as strings, in file order ("" for an empty CSV cell, None for a JSON
    null or a key a line lacks): CSV with a header line, or JSON Lines (one object a line,
    blank lines skipped)."""
    if path.suffix.lower() == ".csv":
        try:
            # utf-8-sig: a byte-order mark (spreadsheets write one) is not part of the header.
            return pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
        except pd.errors.EmptyDataError:
            return pd.DataFrame()
        except (pd.errors.ParserError, UnicodeDecodeError) as err:
            detail = " ".join(str(err).split())
            raise ConfigError(f"{path}: not a readable CSV file ({detail})") from None
    records = []
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a readable JSON Lines file ({err})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: line {number} is not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ConfigError(
                f"{path}: line {number} is not a JSON object; a JSON Lines prompt file holds "
                'one object a line, like {"prompt": ..., "answer": ..., "distractor": ...}'
            )
        # As pandas' dtype=str reads them: a number or boolean becomes its text.
        records.append(
            {k: v if v is None or isinstance(v, str) else str(v) for k, v in record.items()}
        )
    return pd.DataFrame.from_records(records)


def read_prompt_file(path: Path, n: int | None = None, *, n_key: str | None = None) -> pd.DataFrame:
    """The rows of a user's prompt file a behaviour uses, as strings: the first `n` (every row
    when None). The validation before any job and the prompts stage both read through here.

    Refused with a ConfigError naming the file: unreadable, a required column missing, no rows,
    an empty or missing cell of prompt, answer or distractor in the rows used (its row and
    column named; row 1 is the first prompt, the CSV header not counted), and, when `n_key`
    names the config key asking for `n`, fewer than `n` rows. An empty corrupted_prompt means
    "borrow one" (see `file_prompts`).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file does not exist")
    frame = _read_table(path)
    if frame.empty and not len(frame.columns):
        raise ConfigError(f"{path}: holds no prompts (the file is empty)")
    missing = [c for c in PROMPT_FILE_COLUMNS if c not in frame.columns]
    if missing:
        has = ", ".join(map(str, frame.columns)) or "none"
        raise ConfigError(
            f"{path}: missing column(s) {', '.join(missing)} (columns found: {has}); a prompt "
            "file needs prompt, answer and distractor"
        )
    if frame.empty:
        raise ConfigError(f"{path}: holds no prompts (only a header)")
    if n_key is not None and n is not None and len(frame) < n:
        raise ConfigError(
            f"{path}: holds {len(frame)} prompt row{'s' * (len(frame) != 1)} but {n_key} asks "
            f"for {n}; add rows or set {n_key} to at most {len(frame)}"
        )
    frame = frame.head(n) if n is not None else frame
    columns = [*PROMPT_FILE_COLUMNS] + (["corrupted_prompt"] if "corrupted_prompt" in frame else [])
    frame = frame[columns].reset_index(drop=True)
    if "corrupted_prompt" in frame:
        frame["corrupted_prompt"] = frame["corrupted_prompt"].fillna("")
    for i, row in enumerate(frame[list(PROMPT_FILE_COLUMNS)].itertuples(index=False)):
        for column, value in zip(PROMPT_FILE_COLUMNS, row, strict=True):
            if value is None or (isinstance(value, float) and np.isnan(value)) or value == "":
                raise ConfigError(f"{path}: row {i + 1}: {column} is empty")
    return frame


def file_prompts(
    path: Path, encoder: Encoder, rng, n: int, *, n_key: str | None = None
) -> pd.DataFrame:
    """User prompts: the first `n` rows of the file (at most `n`, unless `n_key` names the key
    that asks for exactly `n`: see `read_prompt_file`). Answers and distractors are encoded as
    written (write ' Paris' when a space precedes the word) and must each be one token: a longer
    one is refused naming its row, never cut to its first token. A prompt without a corrupted
    twin gets another row's prompt of the same token length and a different answer (resample
    corruption)."""
    path = Path(path)
    frame = read_prompt_file(path, n, n_key=n_key)
    clean = [encoder.prompt(p) for p in frame["prompt"]]
    answers = [
        encoder.one(text, f"{path}: row {i + 1}: answer") for i, text in enumerate(frame["answer"])
    ]
    given = frame["corrupted_prompt"] if "corrupted_prompt" in frame else [""] * len(frame)
    corrupted = []
    for i, text in enumerate(given):
        if text:
            ids = encoder.prompt(text)
        else:
            twins = [
                j
                for j in range(len(clean))
                if len(clean[j]) == len(clean[i]) and answers[j] != answers[i]
            ]
            if not twins:
                raise ConfigError(
                    f"{path}: row {i + 1} has no corrupted_prompt and no other prompt of the same "
                    "token length with a different answer to borrow"
                )
            ids = clean[int(rng.choice(twins))]
        if len(ids) != len(clean[i]):
            raise ConfigError(
                f"{path}: row {i + 1}: corrupted_prompt has {len(ids) - 1} tokens, prompt has "
                f"{len(clean[i]) - 1}; they must match for patching"
            )
        corrupted.append(ids)
    distractors = []
    for i, (text, answer) in enumerate(zip(frame["distractor"], answers, strict=True)):
        distractors.append(encoder.one(text, f"{path}: row {i + 1}: distractor"))
        if distractors[-1] == answer:
            raise ConfigError(f"{path}: row {i + 1}: answer and distractor are the same token")
    return _rows(clean, corrupted, answers, distractors, encoder)


# --- the registry of sources ----------------------------------------------------------------------
@dataclass(frozen=True)
class BehaviourConfig:
    """One entry of the `behaviours:` config section (defaults: the schema's)."""

    source: str  # a key of SOURCES
    path: str | None = None  # source: file only
    n_prompts: int = schema_defaults("behaviours.<name>")["n_prompts"]

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> BehaviourConfig:
        """From the entry `behaviours.<name>`, whole or partial (the schema checks it)."""
        return typed(cls, d, f"behaviours.{name}")


@dataclass(frozen=True)
class PromptContext:
    """What a source may draw on: the embedded model's language (None for real models), an
    encoder with the model's tokenizer, the behaviour's config entry, the folder a relative
    `path` resolves against (config validation has made it absolute already) and the
    behaviour's name."""

    language: SyntheticLanguage | None
    encoder: Encoder
    spec: BehaviourConfig
    base_dir: Path
    name: str = ""


@dataclass(frozen=True)
class Source:
    make: Callable[[PromptContext, np.random.Generator, int], pd.DataFrame]
    models: str  # the model kinds it works with: embedded | real | any
    needs_path: bool = False

    def works_with(self, embedded: bool) -> bool:
        return self.models == "any" or self.models == ("embedded" if embedded else "real")


def prompt_file_path(spec: BehaviourConfig, base_dir: Path | str) -> Path:
    """The absolute path of a `source: file` behaviour's file: `path` as config validation
    resolved it (absolute), or a relative one against `base_dir`."""
    path = Path(spec.path).expanduser()
    return path if path.is_absolute() else (Path(base_dir) / path).absolute()


def _file(ctx: PromptContext, rng, n: int) -> pd.DataFrame:
    path = prompt_file_path(ctx.spec, ctx.base_dir)
    return file_prompts(path, ctx.encoder, rng, n, n_key=f"behaviours.{ctx.name}.n_prompts")


SOURCES: dict[str, Source] = {
    "induction": Source(
        lambda c, rng, n: synthetic_prompts("induction", c.language, rng, n), "embedded"
    ),
    "facts": Source(lambda c, rng, n: synthetic_prompts("facts", c.language, rng, n), "embedded"),
    "ioi": Source(lambda c, rng, n: ioi_prompts(c.encoder, rng, n), "real"),
    "factual_recall": Source(lambda c, rng, n: factual_recall_prompts(c.encoder, rng, n), "real"),
    "file": Source(_file, "any", needs_path=True),
}


def allowed_sources(embedded: bool) -> list[str]:
    return [name for name, source in SOURCES.items() if source.works_with(embedded)]


def make_prompts(
    name: str,
    spec: BehaviourConfig,
    seed: int,
    model_info: dict,
    model_dir: Path,
    base_dir: Path | str | None = None,
) -> pd.DataFrame:
    """Prompts of behaviour `name` (config `behaviours.<name>`) for the model in `model_dir`.
    A relative `path` resolves against `base_dir` (default: the working directory); a resolved
    config holds it absolute. A file's problems are one line naming `behaviours.<name>.path`."""
    embedded = model_info["kind"] == "embedded"
    source = SOURCES.get(spec.source)
    if source is None or not source.works_with(embedded):
        raise ConfigError(
            f"behaviours.{name}.source: {spec.source!r} does not work with this model"
        )
    if embedded:
        language = SyntheticLanguage(LanguageConfig(**model_info["language"]))
        encoder = Encoder(language.tokenizer)
    else:
        from circuitflow.model.load import load_tokenizer

        language, encoder = None, Encoder(load_tokenizer(model_dir))
    context = PromptContext(language, encoder, spec, Path(base_dir or Path.cwd()), name)
    try:
        return source.make(context, behaviour_rng(seed, name), spec.n_prompts)
    except ConfigError as err:
        if not source.needs_path:
            raise
        raise ConfigError(f"behaviours.{name}.path: {err}") from None


def run(config: dict, behaviour: str, model_dir: Path | str, out: Path | str) -> pd.DataFrame:
    """The stage: write behaviour `behaviour`'s prompt set to `out` (parquet)."""
    from circuitflow.model.load import read_model_json

    if behaviour not in config["behaviours"]:
        raise ConfigError(f"behaviours: no behaviour named {behaviour!r}")
    frame = make_prompts(
        behaviour,
        BehaviourConfig.from_dict(behaviour, config["behaviours"][behaviour]),
        config["seed"],
        read_model_json(model_dir),
        Path(model_dir),
    )
    write_parquet(out, frame)
    return frame


def read_prompts(path: Path | str) -> pd.DataFrame:
    """A prompts parquet, checked against the contract (columns, equal clean/corrupted lengths)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: prompts file does not exist; run the prompts stage")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise InputError(f"{path}: not a readable parquet file ({type(err).__name__})") from None
    missing = [c for c in PROMPT_COLUMNS[:5] if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: not a prompts table (missing columns {', '.join(missing)})")
    if frame.empty:
        raise InputError(f"{path}: holds no prompts")
    bad = [
        i
        for i, (c, k) in enumerate(
            zip(frame["clean_tokens"], frame["corrupted_tokens"], strict=True)
        )
        if len(c) != len(k)
    ]
    if bad:
        raise InputError(f"{path}: row {bad[0]}: clean and corrupted tokens differ in length")
    return frame
