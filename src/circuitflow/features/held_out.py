"""The held-out contexts the features' labels are scored on (rule held_out_tokens):
`activations/held_out_tokens.npy` [n, context_length] int32 and `held_out_tokens.json`, in the
token set's format (capture/tokens.py), `features.held_out_tokens` counted tokens.

No dictionary was trained or evaluated on them, and no label is written from them, whatever
the dictionary source: they are not rows of the token set (which every source trains or
evaluates on) but more of the same kind of text, so the token set and everything made from it
stay as they are. The embedded language draws them from a random stream of their own
(HELD_OUT_STREAM, beside the token set's); a text corpus gives the contexts packed right after
the token set's last one (the corpus is packed again up to there: the documents that follow the
token set's). `held_out_tokens.json` records the token set's hash they follow.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from circuitflow.capture.config import CaptureConfig
from circuitflow.capture.tokens import (
    SYNTHETIC,
    corpus_documents,
    pack,
    read_token_set,
    synthetic_contexts,
    token_set_hash,
    write_token_set,
)

HELD_OUT_STREAM = "features-held-out"
RULE = "held_out_tokens"


def n_contexts(config: dict, context_length: int) -> int:
    """Contexts of the held-out set: `features.held_out_tokens` counted tokens (BOS left out
    as capture.exclude_bos says), whole contexts."""
    counted = context_length - int(bool(config["capture"]["exclude_bos"]))
    return math.ceil(config["features"]["held_out_tokens"] / counted)


def build(config: dict, model_dir: Path | str, token_meta: dict) -> tuple[np.ndarray, dict]:
    """The held-out contexts for the run whose token set `token_meta` describes, and their
    description."""
    from circuitflow import inputs

    t = int(token_meta["context_length"])
    n = n_contexts(config, t)
    source = token_meta["source"]
    if source == SYNTHETIC:  # the language's description alone: no torch in this job
        path = Path(model_dir) / "model.json"
        info = inputs.json_file(path, ("language",), "the model stage", "model.json")
        tokens, bos = synthetic_contexts(info, config["seed"], n, t, HELD_OUT_STREAM)
        how = f"drawn from the embedded language's random stream {HELD_OUT_STREAM!r}"
    else:
        before = int(token_meta["n_contexts"])
        short = (
            f"features.held_out_tokens: corpus {source} holds {{filled:,}} tokens; the token "
            f"set's {before:,} contexts and {n:,} held-out contexts after them ask for "
            "{need:,}; use a larger corpus (capture.corpus) or fewer features.held_out_tokens"
        )
        from circuitflow.model.load import load_tokenizer

        capture = CaptureConfig.from_dict(config["capture"])
        packed, bos = pack(corpus_documents(capture, source), load_tokenizer(model_dir),
                           before + n, t, source, short)  # fmt: skip
        tokens = packed[before:]
        how = f"the corpus's contexts after the token set's {before:,}"
    meta = {
        "source": source,
        "n_contexts": n,
        "context_length": t,
        "bos_token_id": bos,
        "token_set_hash": token_set_hash(tokens),
        "model_hash": token_meta.get("model_hash"),
        "seed": config["seed"],
        "held_out_from": token_meta.get("token_set_hash"),
        "how": how,
    }
    return tokens, meta


def run(config: dict, model_json, tokens_json, out_npy, out_json) -> dict:
    """The rule: build the held-out contexts of the run's token set (its tokens.json) and
    write them."""
    from circuitflow import inputs

    token_meta = inputs.json_file(tokens_json, ("n_contexts", "context_length", "source"),
                                  "capture_tokens", "token set")  # fmt: skip
    tokens, meta = build(config, Path(model_json).parent, token_meta)
    write_token_set(tokens, meta, out_npy, out_json)
    return meta


def read(npy_path, json_path) -> tuple[np.ndarray, dict]:
    """The held-out contexts (memory-mapped) and their description."""
    return read_token_set(npy_path, json_path, rerun=RULE)


# --- held-out examples: the evidence a free-text label is scored on ------------------------------
EXAMPLE_COLUMNS = ("feature", "fires", "rank", "context", "position", "activation",
                   "window_start", "qualifying_index", "tokens")  # fmt: skip


def examples(
    position: np.ndarray, feature: np.ndarray, activation: np.ndarray, held: np.ndarray,
    live: np.ndarray, n: int, window: tuple[int, int], first: int, seed: int,
) -> dict[str, np.ndarray | list]:  # fmt: skip
    """Per live feature, `n` held-out positions where it fires, spread over its activations
    (the positions at evenly spaced ranks of its firing activations, the highest first), and
    `n` random ones where it does not: the examples a detection scorer shows a reader of the
    label (features/explainer.py). `position`, `feature`, `activation`: the firing entries of
    the held-out pass (`position` counts the counted positions, context by context, from
    `first`); `held`: the held-out contexts. Each example's window is `window` (left, right)
    tokens around it, cut at the context's ends and before `first`. Columns EXAMPLE_COLUMNS."""
    t = held.shape[1]
    per = t - first
    total = len(held) * per
    n_features = len(live)
    order = np.lexsort((-activation, feature))  # by feature, then activation descending
    feature, position, activation = feature[order], position[order], activation[order]
    starts = np.searchsorted(feature, np.arange(n_features + 1))
    count = np.where(live, np.diff(starts), 0)
    # Firing: ranks round(linspace(0, count - 1, min(n, count))) of each feature's entries.
    take = np.minimum(count, n)
    f_fire = np.repeat(np.arange(n_features), take)
    j = np.arange(len(f_fire)) - np.repeat(np.cumsum(take) - take, take)
    step = np.where(take > 1, (count - 1) / np.maximum(take - 1, 1), 0.0)[f_fire]
    at = starts[f_fire] + np.round(j * step).astype(np.int64)
    # Quiet: random positions, those where the feature fires left out (4 n draws suffice: a
    # live feature fires on well under half of the positions).
    rng = np.random.default_rng([seed, 4848])
    f_draw = np.repeat(np.flatnonzero(live), 4 * n)
    draws = rng.integers(0, total, size=len(f_draw))
    codes = f_draw.astype(np.int64) * total + draws
    firing = np.sort(feature.astype(np.int64) * total + position)
    hit = np.searchsorted(firing, codes).clip(max=max(len(firing) - 1, 0))
    quiet = ~(firing[hit] == codes) if len(firing) else np.ones(len(codes), dtype=bool)
    frame = np.stack([f_draw, draws], 1)[quiet]
    _, first_seen = np.unique(frame, axis=0, return_index=True)
    frame = frame[np.sort(first_seen)]  # each (feature, position) once, in draw order
    rank_q = np.arange(len(frame)) - np.searchsorted(frame[:, 0], frame[:, 0])
    frame, rank_q = frame[rank_q < n], rank_q[rank_q < n]
    feats = np.concatenate([f_fire, frame[:, 0]])
    where = np.concatenate([position[at], frame[:, 1]])
    ctx, pos = where // per, where % per + first
    offsets = np.arange(-window[0], window[1] + 1)
    cols = pos[:, None] + offsets[None, :]
    valid = (cols >= first) & (cols < t)
    toks = np.asarray(held, dtype=np.int64)[ctx[:, None], cols.clip(0, t - 1)]
    lo = np.where(valid, cols, t).min(1)
    return {
        "feature": feats,
        "fires": np.concatenate([np.ones(len(f_fire), bool), np.zeros(len(frame), bool)]),
        "rank": np.concatenate([j, rank_q]),
        "context": ctx,
        "position": pos,
        "activation": np.concatenate([activation[at], np.zeros(len(frame))]).astype(np.float32),
        "window_start": lo,
        "qualifying_index": pos - lo,
        "tokens": [row[ok] for row, ok in zip(toks, valid, strict=True)],
    }
