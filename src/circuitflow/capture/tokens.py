"""The capture token set (rule capture_tokens): a fixed set of packed contexts, built once and
hashed.

* The embedded default model draws documents from its own synthetic language, seeded from the
  config seed on a stream of its own (not the training or evaluation streams), block by block.
* Real models read a local text corpus (a .txt, .jsonl or .parquet file, or a directory of
  them) or a Hugging Face dataset name (pre-fetched into the cache by the `prefetch_corpus`
  localrule; jobs run offline), tokenize it with the model's tokenizer and pack the documents,
  separated by EOS, into contexts of `context_length` tokens each starting with BOS.

The token set is written as `tokens.npy` [n_contexts, context_length] int32 plus `tokens.json`
(its sha256 and how it was made). Every capture output carries that hash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from circuitflow import dictionary_sources
from circuitflow.capture.config import CaptureConfig
from circuitflow.errors import InputError
from circuitflow.io import atomic_path, write_json

log = logging.getLogger(__name__)
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
SYNTHETIC = "synthetic"
BLOCK_CONTEXTS = 1024  # synthetic contexts generated per seeded block
REAL_MODEL_CONTEXT = 128  # default packed context length for real models


def stream_salt(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def token_set_hash(tokens: np.ndarray) -> str:
    """sha256 over the contexts' shape and int32 bytes, independent of the file format."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    digest = hashlib.sha256(json.dumps(list(tokens.shape)).encode())
    digest.update(tokens.tobytes())
    return digest.hexdigest()


def context_length_for(capture: CaptureConfig, model_info: dict) -> int:
    """`capture.context_length`, or the model's context (embedded) / min(n_ctx, 128) (real)."""
    n_ctx = int(model_info["architecture"]["n_ctx"])
    want = capture.context_length
    if want is None:
        want = n_ctx if model_info["kind"] == "embedded" else min(n_ctx, REAL_MODEL_CONTEXT)
    if not 2 <= want <= n_ctx:
        raise ValueError(
            f"capture.context_length: {want} must be between 2 and the model's {n_ctx}"
        )
    return int(want)


def n_contexts_for(n_tokens: int, context_length: int, exclude_bos: bool) -> int:
    """Whole contexts needed for at least `n_tokens` stored activation rows."""
    per_context = context_length - 1 if exclude_bos else context_length
    return math.ceil(n_tokens / per_context)


def corpus_source(capture: CaptureConfig, model_info: dict) -> str:
    """`synthetic`, a local path, or a Hugging Face dataset name."""
    corpus = capture.corpus
    if corpus is None:
        if model_info["kind"] == "embedded":
            return SYNTHETIC
        raise ValueError(
            "capture.corpus: a real model needs a corpus (a local .txt/.jsonl/.parquet file or "
            "directory, or a Hugging Face dataset name such as NeelNanda/pile-10k)"
        )
    return str(corpus)


def is_hub_dataset(source: str) -> bool:
    return source != SYNTHETIC and not Path(source).exists()


# --- synthetic ------------------------------------------------------------------------------------
def synthetic_contexts(model_info: dict, seed: int, n_contexts: int, context_length: int,
                       stream: str = "capture-corpus"):  # fmt: skip
    """Documents of the embedded model's language, drawn block by block from the random
    stream named `stream` (the token set's, or another: the features' held-out contexts)."""
    from circuitflow.model.language import LanguageConfig, SyntheticLanguage

    language = SyntheticLanguage(LanguageConfig(**model_info["language"]))
    out = np.empty((n_contexts, context_length), dtype=np.int32)
    salt = stream_salt(stream)
    for block, start in enumerate(range(0, n_contexts, BLOCK_CONTEXTS)):
        rng = np.random.default_rng([seed, salt, block])
        n = min(BLOCK_CONTEXTS, n_contexts - start)
        out[start : start + n] = language.batch(rng, n, context_length)
    return out, language.bos_id


# --- text corpora ---------------------------------------------------------------------------------
def _files(path: Path) -> list[Path]:
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES)
    bad = [p for p in files if p.suffix.lower() not in TEXT_SUFFIXES]
    if not files or bad:
        raise ValueError(
            f"capture.corpus: {path} holds no usable files; give .txt (one document a line), "
            ".jsonl or .parquet files"
        )
    return files


def local_documents(path: Path, text_column: str) -> Iterator[str]:
    for file in _files(path):
        suffix = file.suffix.lower()
        if suffix == ".txt":
            with open(file, encoding="utf-8") as fh:
                yield from (line.rstrip("\n") for line in fh if line.strip())
        elif suffix == ".jsonl":
            with open(file, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        row = json.loads(line)
                        if text_column not in row:
                            raise ValueError(
                                f"capture.text_column: {file} line {n} has no {text_column!r} field"
                            )
                        yield row[text_column]
        else:
            import pyarrow.parquet as pq

            table = pq.ParquetFile(file)
            if text_column not in table.schema_arrow.names:
                raise ValueError(f"capture.text_column: {file} has no column {text_column!r}")
            for batch in table.iter_batches(columns=[text_column], batch_size=1024):
                yield from batch.column(0).to_pylist()


def hub_documents(name: str, split: str, text_column: str) -> Iterator[str]:
    """Rows of a Hugging Face dataset from the local cache (jobs run with the hub offline)."""
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as err:  # noqa: BLE001 - one line that says what to do
        raise ValueError(
            f"capture.corpus: cannot load dataset {name!r} (split {split!r}) from the cache "
            f"({type(err).__name__}); run `snakemake prefetch_corpus` on a machine with internet"
        ) from None
    if text_column not in data.column_names:
        raise ValueError(f"capture.text_column: dataset {name!r} has no column {text_column!r}")
    for row in data.select_columns([text_column]):
        yield row[text_column]


def corpus_documents(capture: CaptureConfig, source: str) -> Iterator[str]:
    """The documents of `source` (corpus_source: a local path or a dataset name), in order."""
    if Path(source).exists():
        return local_documents(Path(source), capture.text_column)
    return hub_documents(source, capture.split, capture.text_column)


def pack(documents, tokenizer, n_contexts: int, context_length: int, source: str,
         short: str | None = None):  # fmt: skip
    """Tokenize documents in order, join them with EOS, cut into BOS-led contexts. `short`:
    the error's words when the corpus runs out (a format string with `filled` and `need`)."""
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if bos is None:
        raise ValueError("capture.corpus: the model's tokenizer has neither a BOS nor an EOS token")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else bos
    body = context_length - 1
    need = n_contexts * body
    stream = np.empty(need, dtype=np.int32)
    filled = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal filled
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            take = min(len(ids) + 1, need - filled)
            stream[filled : filled + take] = ([*ids, eos])[:take]
            filled += take
        batch.clear()

    for text in documents:
        if text:
            batch.append(text)
        if len(batch) == 256:
            flush()
        if filled >= need:
            break
    if batch and filled < need:
        flush()
    if filled < need and short:
        raise ValueError(short.format(filled=filled, need=need))
    if filled < need:
        raise ValueError(
            f"capture.n_tokens: corpus {source} has only {filled} tokens, {need} are needed; "
            "use a larger corpus or fewer tokens"
        )
    contexts = np.empty((n_contexts, context_length), dtype=np.int32)
    contexts[:, 0] = bos
    contexts[:, 1:] = stream.reshape(n_contexts, body)
    return contexts, int(bos)


# --- the token set --------------------------------------------------------------------------------
def build_token_set(
    capture: CaptureConfig, seed: int, model_dir: Path | str, stream: dict | None = None
) -> tuple[np.ndarray, dict]:
    """The packed contexts for `capture` (the config section) and their description. With
    `stream` (the `sae` section of a config whose source trains on the token set, `sae.source:
    stream`) the set holds `sae.total_tokens` rows for training, distinct tokens, and
    `sae.eval_contexts` contexts more at its end, held out for the SAEs' evaluation
    (`held_out_contexts` in the description)."""
    from circuitflow.model.load import load_tokenizer, read_model_json

    info = read_model_json(model_dir)
    context_length = context_length_for(capture, info)
    n_rows = stream["total_tokens"] if stream else capture.n_tokens
    held_out = stream["eval_contexts"] if stream else 0
    n_contexts = n_contexts_for(n_rows, context_length, capture.exclude_bos) + held_out
    source = corpus_source(capture, info)
    if source == SYNTHETIC:
        tokens, bos = synthetic_contexts(info, seed, n_contexts, context_length)
    else:
        docs = corpus_documents(capture, source)
        tokenizer = load_tokenizer(model_dir)
        short = None
        if stream:
            short = (
                f"sae.total_tokens: corpus {source} holds {{filled:,}} tokens; streaming "
                f"{n_rows:,} training tokens and {held_out} evaluation contexts asks for "
                "{need:,}; use a larger corpus (capture.corpus) or a smaller sae.total_tokens"
            )
        tokens, bos = pack(docs, tokenizer, n_contexts, context_length, source, short)
    meta = {
        "source": source,
        "split": capture.split if is_hub_dataset(source) else None,
        "n_contexts": n_contexts,
        "context_length": context_length,
        "bos_token_id": bos,
        "token_set_hash": token_set_hash(tokens),
        "model_hash": info["weights_sha256"],
        "seed": seed,
    }
    if stream:
        meta["held_out_contexts"] = held_out
    return tokens, meta


def write_token_set(tokens: np.ndarray, meta: dict, npy_path: Path | str, json_path: Path | str):
    with atomic_path(npy_path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, np.ascontiguousarray(tokens, dtype=np.int32))
    write_json(json_path, meta)


def read_token_set(npy_path: Path | str, json_path: Path | str,
                   rerun: str = "capture_tokens") -> tuple[np.ndarray, dict]:  # fmt: skip
    """The contexts (memory-mapped, so only the slices in use are read) and their description;
    `rerun`: the rule that writes them, which a message about a damaged file names."""
    from circuitflow import inputs

    meta = inputs.json_file(json_path, ("n_contexts", "context_length"), rerun, "token set")
    try:
        tokens = np.load(inputs.existing_file(npy_path, rerun), mmap_mode="r")
    except (OSError, ValueError) as err:
        raise InputError(f"{npy_path}: not a readable token set ({err}); rerun {rerun}") from None
    if tokens.shape != (meta.get("n_contexts"), meta.get("context_length")):
        raise InputError(f"{npy_path}: shape {tokens.shape} does not match {json_path}")
    return tokens, meta


def last_contexts(tokens: np.ndarray, n: int):
    """The last `n` contexts of a token set as an int64 tensor [n, context_length] (BOS first):
    what an SAE is evaluated on when no activation file holds its tokens (sae.source stream or
    pretrained), as the capture path takes the last contexts of its file."""
    import torch

    n = min(n, len(tokens))
    if n < 1:
        raise InputError("the token set holds no context")
    return torch.from_numpy(np.asarray(tokens[len(tokens) - n :], dtype=np.int64))


def run(config: dict, model_json: Path | str, out_npy: Path | str, out_json: Path | str) -> dict:
    """The stage: build the token set for `config` (seed, model, capture) and write it."""
    import os

    if config["model"]["hf_cache"]:
        os.environ["HF_HOME"] = str(Path(config["model"]["hf_cache"]).expanduser())
    capture = CaptureConfig.from_dict(config["capture"])
    # The sae section is given where the token set holds the source's training rows.
    sae = config.get("sae") or {}
    trains = "source" in sae and dictionary_sources.named(sae["source"]).trains_on_token_set
    stream = sae if trains else None
    tokens, meta = build_token_set(capture, config["seed"], Path(model_json).parent, stream)
    write_token_set(tokens, meta, out_npy, out_json)
    return meta


def prefetch(name: str, split: str, hf_cache: str | None = None) -> dict:
    """Download a Hugging Face dataset into the cache (login node, internet)."""
    import os

    if hf_cache:
        os.environ["HF_HOME"] = str(Path(hf_cache).expanduser())
    import datasets

    data = datasets.load_dataset(name, split=split)
    return {"dataset": name, "split": split, "n_rows": len(data), "fingerprint": data._fingerprint}
