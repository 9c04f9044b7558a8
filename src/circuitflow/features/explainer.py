"""The explainer labeller (rules explain_features_*, when `features.labeller` names a model): a
local instruct language model explains each live feature from its top and quantile contexts,
and its explanation is scored, as every label is, on held-out tokens.

**Explaining.** The prompt shows the feature's first `features.explainer.contexts` contexts
(its top ones, strongest first, then its quantile samples, the highest band first) with the
token each was kept for marked `<<like this>>`, and asks for a short description; the model
answers greedily, `max_new_tokens` at most, prompts batched (left-padded) `batch_size` at a
time. An instruct model's chat template frames the prompt where the tokenizer has one.

**Scoring (detection, as EleutherAI's delphi scores explanations).** Free text names no rule,
so the same model reads the explanation and one held-out example at a time (examples.parquet:
`features.explainer.examples` positions where the feature fires, spread over its activations,
and as many random ones where it does not; held_out.examples) and is asked whether the feature
fires on the marked token; its answer is Yes where its next-token logit of "Yes" beats "No". On
the sample that gives recall r (firing examples answered Yes) and false-positive rate q (quiet
ones answered Yes); with the feature's held-out firing count P and the held-out tokens N, the
expected counts over every held-out token are tp = r P, fn = (1 - r) P, fp = q (N - P), and
precision and F1 follow from them as for a rule (scores.Scores): comparable to the
deterministic labellers' exact counts. The control asks the same questions with another live
feature's explanation (scores.control_order). A model that explains nothing scores like its
control: tests/features/test_explainer.py checks it with a model of random weights.

**Output.** Each dictionary's folder is written again under features/ (from the features
job's, which then goes to features_deterministic/), its features.parquet with
`label_explainer`, `label_explainer_f1` and the detection counts, and the label shown chosen
again among the three labellers by held-out mean F1 (labels.pick).

**Resuming.** Explanations and answers are saved to the checkpoint directory every
`checkpoint_features` features and on SIGTERM (then exit 75); a rerun with the same explainer,
folders and settings continues from there.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.features.config import ExplainerConfig
from circuitflow.features.labels import pick
from circuitflow.features.scores import Scores, control_order, summarise
from circuitflow.io import (
    atomic_dir,
    atomic_path,
    json_text,
    sha256_file,
    write_json,
    write_parquet,
)
from circuitflow.resumable import Interrupted, sigterm_flag

log = logging.getLogger(__name__)

NAME = "explainer"  # the labeller's name in features.parquet's columns and summary.json
ANSWERS = ("Yes", "No")
EXPLAIN = (
    "We study one feature of a language model. It activates on the tokens marked <<like "
    "this>> in the excerpts below (strongest first).\n\n{excerpts}\n\nIn a few words, what "
    "does the feature respond to? Reply with the description only."
)
DETECT = (
    "A feature of a language model is described as: {explanation}\n\nExcerpt: {excerpt}\n\n"
    "Does the feature activate on the token marked <<like this>>? Answer Yes or No."
)
FILES = ("features.parquet", "contexts.parquet", "examples.parquet", "summary.json")


# --- the model ------------------------------------------------------------------------------------
def load(info: dict, device: str):
    """The explainer (transformers' causal LM, eval, bfloat16 on a GPU) and its tokenizer,
    left-padded, from its prefetch record (model.load.prefetch: a local directory or a hub
    snapshot)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from circuitflow.devices import resolve_device

    path = info.get("snapshot") or info["path"]
    device = resolve_device(device)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, tok


def render(tok, text: str) -> str:
    """`text` as the user's turn, framed by the tokenizer's chat template where it has one."""
    if getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": text}]
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"User: {text}\nAssistant:"


def excerpt(tokens: list[str], marked: int) -> str:
    """A window's text with token `marked` as <<token>>; word-level tokens (no leading spaces)
    joined by spaces."""
    joiner = "" if any(t[:1].isspace() for t in tokens) else " "
    parts = [f"<<{t}>>" if i == marked else t for i, t in enumerate(tokens)]
    return joiner.join(parts).replace("\n", "\\n")


def _batches(tok, prompts: list[str], size: int, device):
    for s in range(0, len(prompts), size):
        enc = tok(prompts[s : s + size], return_tensors="pt", padding=True)
        yield s, {k: v.to(device) for k, v in enc.items()}


@torch.inference_mode()
def generate(model, tok, prompts: list[str], batch: int, max_new_tokens: int) -> list[str]:
    """Greedy answers to `prompts` (already rendered), their first line, stripped."""
    out = []
    for _, enc in _batches(tok, prompts, batch, model.device):
        ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)  # fmt: skip
        new = ids[:, enc["input_ids"].shape[1] :]
        for text in tok.batch_decode(new, skip_special_tokens=True):
            line = text.strip().splitlines()[0].strip() if text.strip() else ""
            out.append(line or "(no description)")
    return out


def answer_ids(tok) -> tuple[int, int]:
    """The first token of each answer in ANSWERS."""
    return tuple(tok(a, add_special_tokens=False)["input_ids"][0] for a in ANSWERS)


@torch.inference_mode()
def judge(model, tok, prompts: list[str], batch: int) -> np.ndarray:
    """For each rendered prompt whether the model's next-token logit of "Yes" beats "No"
    (float32 logits), one forward pass a batch."""
    yes, no = answer_ids(tok)
    out = np.zeros(len(prompts), dtype=bool)
    for s, enc in _batches(tok, prompts, batch, model.device):
        mask = enc["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens from 0
        logits = model(**enc, position_ids=positions).logits[:, -1].float()
        out[s : s + len(mask)] = (logits[:, yes] > logits[:, no]).cpu().numpy()
    return out


# --- prompts from a dictionary's files ------------------------------------------------------------
def explain_prompts(ctx: pd.DataFrame, features: list[int], n: int) -> dict[int, str]:
    """Each feature's explanation prompt (EXPLAIN): its first `n` contexts, top ones by rank,
    then quantile samples from the highest band down."""
    order = ctx.assign(_top=ctx["kind"] != "top", _band=-ctx["band"])
    order = order.sort_values(["feature", "_top", "_band", "rank"], kind="stable")
    out = {}
    for f, g in order.groupby("feature", sort=False):
        if int(f) in features:
            lines = [
                f"{i + 1}. {excerpt(list(w), int(q))}"
                for i, (w, q) in enumerate(zip(g["token_str"][:n], g["qualifying_index"][:n],
                                               strict=True))
            ]  # fmt: skip
            out[int(f)] = EXPLAIN.format(excerpts="\n".join(lines))
    return out


def detection_prompt(explanation: str, tokens: list[str], marked: int) -> str:
    return DETECT.format(explanation=explanation, excerpt=excerpt(tokens, marked))


# --- the stage ------------------------------------------------------------------------------------
def checkpoint_key(info: dict, folders: list[Path], opts: ExplainerConfig) -> str:
    return json.dumps(
        {
            "explainer": info.get("weights_sha256"),
            "folders": [sha256_file(Path(f) / "features.parquet") for f in folders],
            "contexts": opts.contexts,
            "max_new_tokens": opts.max_new_tokens,
            "examples": opts.examples,
        },
        sort_keys=True,
    )


def detection_scores(fires: np.ndarray, said_yes: np.ndarray, feature: np.ndarray,
                     positives: np.ndarray, n_tokens: int) -> tuple[Scores, dict]:  # fmt: skip
    """Expected counts over the held-out tokens (module docstring) of each feature, from its
    examples (`fires`, the model's answer `said_yes`, by example's `feature`), its held-out
    firing count `positives` [F] and the held-out tokens; and the sample's own counts."""
    f_total = len(positives)

    def per_feature(mask: np.ndarray) -> np.ndarray:
        return np.bincount(feature[mask], minlength=f_total).astype(np.float64)

    n_fire, n_quiet = per_feature(fires), per_feature(~fires)
    yes_fire, yes_quiet = per_feature(fires & said_yes), per_feature(~fires & said_yes)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(n_fire > 0, yes_fire / n_fire, np.nan)
        fpr = np.where(n_quiet > 0, yes_quiet / n_quiet, np.nan)
    p = positives.astype(np.float64)
    tp, fn = recall * p, (1 - recall) * p
    fp = fpr * (n_tokens - p)
    sample = {"yes_firing": yes_fire, "firing": n_fire, "yes_quiet": yes_quiet, "quiet": n_quiet}
    return Scores(tp=tp, fp=fp, fn=fn), sample


def run(config: dict, explainer_json: Path | str, in_dirs: list, out_dirs: list,
        checkpoint_dir: Path | str | None = None, progress: bool = True) -> list[dict]:  # fmt: skip
    """The stage: explain and score every live feature of each folder of `in_dirs` (the
    features job's, features_deterministic/{site}/layer_{layer}) and write it, with the
    explainer's labels, to the matching `out_dirs` (features/{site}/layer_{layer})."""
    from circuitflow import inputs
    from circuitflow.errors import ConfigError

    if len(in_dirs) != len(out_dirs):
        raise ConfigError("--features and --out must name the same number of folders")
    opts = ExplainerConfig(**config["features"]["explainer"])
    info = inputs.json_file(explainer_json, ("kind",), "prefetch_explainer", "explainer record")
    folders = [Path(d) for d in in_dirs]
    for d in folders:
        for name in FILES:
            inputs.existing_file(d / name, "the features rule")
    model, tok = load(info, config["device"])
    key = checkpoint_key(info, folders, opts)
    ckpt = Path(checkpoint_dir) / "explainer.json" if checkpoint_dir else None
    state = _load_state(ckpt, key)
    summaries = []
    with sigterm_flag() as stop:
        for folder, out in zip(folders, map(Path, out_dirs), strict=True):
            summaries.append(explain_folder(model, tok, folder, out, config, opts, state,
                                            (ckpt, key), stop, progress))  # fmt: skip
    if ckpt is not None and ckpt.exists():
        ckpt.unlink()
    return summaries


def _load_state(path: Path | None, key: str) -> dict:
    if path is None or not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("checkpoint %s is unreadable (%s): starting afresh", path, err)
        return {}
    return state.get("done", {}) if state.get("key") == key else {}


def _save_state(where: tuple[Path | None, str], state: dict) -> None:
    path, key = where
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json_text({"key": key, "done": state}))


def explain_folder(model, tok, folder: Path, out: Path, config: dict, opts: ExplainerConfig,
                   state: dict, where, stop, progress: bool) -> dict:  # fmt: skip
    """One dictionary: explanations, detection answers (with the control's), scores, files."""
    feats = pd.read_parquet(folder / "features.parquet")
    ctx = pd.read_parquet(folder / "contexts.parquet")
    examples = pd.read_parquet(folder / "examples.parquet")
    summary = json.loads((folder / "summary.json").read_text())
    live = ~feats["dead"].to_numpy()
    order = control_order(live, config["seed"])
    done = state.setdefault(str(folder), {"explanations": {}, "answers": {}})
    todo = [int(f) for f in np.flatnonzero(live) if str(int(f)) not in done["answers"]]
    prompts = explain_prompts(ctx, todo, opts.contexts)
    by_feature = dict(tuple(examples.groupby("feature", sort=False)))
    for s in range(0, len(todo), opts.checkpoint_features):
        if stop.requested:
            _save_state(where, state)
            raise Interrupted(f"SIGTERM: {folder}: {len(done['answers'])} features explained")
        part = todo[s : s + opts.checkpoint_features]
        asked = [render(tok, prompts.get(f, EXPLAIN.format(excerpts=""))) for f in part]
        texts = generate(model, tok, asked, opts.batch_size, opts.max_new_tokens)
        done["explanations"].update({str(f): t for f, t in zip(part, texts, strict=True)})
        questions, index = [], []
        for f in part:
            g = by_feature.get(f)
            if g is None:
                continue
            for own in (f, int(order[f])):  # the feature's explanation, then the control's
                text = done["explanations"].get(str(own))
                if text is None:  # the control's feature is explained later: ask it then
                    text = generate(model, tok, [render(tok, prompts_for(ctx, own, opts))],
                                    1, opts.max_new_tokens)[0]  # fmt: skip
                    done["explanations"][str(own)] = text
                for w, q in zip(g["token_str"], g["qualifying_index"], strict=True):
                    questions.append(render(tok, detection_prompt(text, list(w), int(q))))
                    index.append((f, own == f))
        said = judge(model, tok, questions, opts.batch_size)
        for f in part:
            done["answers"][str(f)] = {"own": [], "control": []}
        for (f, own), yes in zip(index, said.tolist(), strict=True):
            done["answers"][str(f)]["own" if own else "control"].append(bool(yes))
        _save_state(where, state)
        if progress:
            log.info("%s: %d of %d live features explained", folder, len(done["answers"]),
                     int(live.sum()))  # fmt: skip
    return write_explained(folder, out, feats, examples, summary, done, live, order, config)


def prompts_for(ctx: pd.DataFrame, feature: int, opts: ExplainerConfig) -> str:
    return explain_prompts(ctx, [feature], opts.contexts).get(feature, EXPLAIN.format(excerpts=""))


def write_explained(folder: Path, out: Path, feats: pd.DataFrame, examples: pd.DataFrame,
                    summary: dict, done: dict, live: np.ndarray, order: np.ndarray,
                    config: dict) -> dict:  # fmt: skip
    """The folder again with the explainer's labels and scores, and the label shown chosen
    among the three labellers."""
    n = len(feats)
    examples = examples.sort_values(["feature", "fires", "rank"], ascending=[True, False, True])
    own = np.zeros(len(examples), dtype=bool)
    control = np.zeros(len(examples), dtype=bool)
    offsets: dict[int, int] = {}
    for i, f in enumerate(examples["feature"].to_numpy()):
        answers = done["answers"].get(str(int(f)))
        k = offsets.get(int(f), 0)
        offsets[int(f)] = k + 1
        if answers:
            own[i], control[i] = answers["own"][k], answers["control"][k]
    fires, feature = examples["fires"].to_numpy(), examples["feature"].to_numpy()
    positives = (feats["label_tp"] + feats["label_fn"]).to_numpy()
    held_tokens = int(summary["labels"]["held_out_tokens"])
    scores, sample = detection_scores(fires, own, feature, positives, held_tokens)
    ctl, _ = detection_scores(fires, control, feature, positives, held_tokens)
    texts = [done["explanations"].get(str(f), "") if live[f] else "dead" for f in range(n)]
    block = summarise(scores, live) | {"control": summarise(ctl, live)}
    labels = summary["labels"]
    labels["labellers"][NAME] = block
    means = {name: b["mean_f1"] for name, b in labels["labellers"].items()}
    chosen = pick(config["features"]["labeller"], means)
    feats = feats.copy()
    feats["label_explainer"] = texts
    feats["label_explainer_f1"] = scores.f1
    for name, values in sample.items():
        feats[f"label_explainer_{name}"] = values.astype(np.int64)
    if chosen == NAME:
        feats["label"], feats["labeller"] = texts, NAME
        for col, values in (("precision", scores.precision), ("recall", scores.recall),
                            ("f1", scores.f1), ("tp", scores.tp), ("fp", scores.fp),
                            ("fn", scores.fn), ("control_f1", ctl.f1)):  # fmt: skip
            feats[f"label_{col}"] = values
    labels["shown"], summary["labeller"] = chosen, chosen
    labels["explainer"] = {
        "model": config["features"]["labeller"],
        "scoring": "detection on held-out examples (features/explainer.py), counts expected "
        "over the held-out tokens",
    }
    with atomic_dir(out) as tmp:
        write_parquet(tmp / "features.parquet", feats)
        for name in ("contexts.parquet", "examples.parquet"):
            shutil.copyfile(folder / name, tmp / name)
        write_json(tmp / "summary.json", summary)
    log.info("%s: explainer mean F1 %s (control %s); shown: %s", out, block["mean_f1"],
             block["control"]["mean_f1"], chosen)  # fmt: skip
    return summary


def job_summary(summaries: list[dict]) -> list[dict[str, Any]]:
    """What the script prints per dictionary."""
    return [
        {
            "site": s.get("site"),
            "layer": s.get("layer"),
            "shown": s["labels"]["shown"],
            "explainer_mean_f1": s["labels"]["labellers"][NAME]["mean_f1"],
            "control_mean_f1": s["labels"]["labellers"][NAME]["control"]["mean_f1"],
        }
        for s in summaries
    ]
