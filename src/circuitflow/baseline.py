"""The baseline stage: how well the unmodified model does each behaviour.

Metric: logit difference (answer - distractor) at the last position. `accuracy` is the share of
prompts where the answer beats the distractor (the two-way choice the metric measures);
`top1_accuracy` asks for the answer to be the model's top token over the whole vocabulary.
Calibration compares the model's top-token confidence with how often that token is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.batching import by_length
from circuitflow.io import save_figure, write_json, write_parquet
from circuitflow.perf import PassCounter
from circuitflow.prompts import prompts_hash
from circuitflow.schema import schema_defaults, typed

_D = schema_defaults("baseline")


@dataclass(frozen=True)
class BaselineConfig:
    """The `baseline:` config section (defaults: the schema's)."""

    batch_size: int = _D["batch_size"]  # prompts per forward pass
    calibration_bins: int = _D["calibration_bins"]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> BaselineConfig:
        """From a `baseline` section, whole or partial (the schema checks it)."""
        return typed(cls, d, "baseline")


@torch.no_grad()
def last_token_logits(
    model, token_lists: list[list[int]], batch_size: int, counter: PassCounter | None = None
) -> torch.Tensor:
    """Final-position logits [n, d_vocab] in float32, batching prompts of equal length together
    (no padding, so no attention-mask subtleties); `counter` counts the forward passes."""
    out = torch.empty(len(token_lists), model.cfg.d_vocab_out, dtype=torch.float32)
    device = next(model.parameters()).device
    for indices in by_length(token_lists):
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size].tolist()
            batch = torch.tensor(np.stack([token_lists[i] for i in chunk]), device=device)
            out[chunk] = model(batch, return_type="logits")[:, -1].float().cpu()
            if counter is not None:
                counter.forward(len(chunk))
    return out


def score_prompts(logits: torch.Tensor, prompts: pd.DataFrame) -> pd.DataFrame:
    answer = torch.tensor(prompts["answer_id"].to_numpy(copy=True))
    distractor = torch.tensor(prompts["distractor_id"].to_numpy(copy=True))
    rows = torch.arange(len(prompts))
    probs = logits.softmax(-1)
    top = logits.argmax(-1)
    return pd.DataFrame(
        {
            "prompt_id": prompts["prompt_id"].to_numpy(),
            "logit_diff": (logits[rows, answer] - logits[rows, distractor]).numpy(),
            "p_answer": probs[rows, answer].numpy(),
            "p_distractor": probs[rows, distractor].numpy(),
            "top_token": top.numpy(),
            "top_prob": probs.max(-1).values.numpy(),
            "correct": (logits[rows, answer] > logits[rows, distractor]).numpy(),
            "top1_correct": (top == answer).numpy(),
        }
    )


def calibration_table(scores: pd.DataFrame, n_bins: int) -> pd.DataFrame:
    """Reliability table: per confidence bin, mean confidence and top-1 accuracy."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.clip(np.digitize(scores["top_prob"], edges[1:-1]), 0, n_bins - 1)
    table = (
        scores.assign(bin=bins)
        .groupby("bin")
        .agg(
            confidence=("top_prob", "mean"),
            accuracy=("top1_correct", "mean"),
            count=("top_prob", "size"),
        )
        .reindex(range(n_bins))
    )
    table["bin_low"], table["bin_high"] = edges[:-1], edges[1:]
    return table.reset_index()


def json_records(table: pd.DataFrame) -> list[dict]:
    """Rows as dicts with empty bins as null (JSON has no NaN)."""
    return table.astype(object).where(table.notna(), None).to_dict(orient="records")


def expected_calibration_error(table: pd.DataFrame) -> float:
    filled = table.dropna()
    weights = filled["count"] / filled["count"].sum()
    return float((weights * (filled["confidence"] - filled["accuracy"]).abs()).sum())


def score(model, prompts: pd.DataFrame, cfg: BaselineConfig | None = None):
    """Score a prompt set; returns (summary dict, per-prompt rows, calibration table). The
    summary counts the forward passes spent (perf.PassCounter, parts clean and corrupted)."""
    cfg = cfg or BaselineConfig()
    batch_size, n_bins = cfg.batch_size, cfg.calibration_bins
    counter = PassCounter()
    with counter.part("clean"):
        clean = last_token_logits(model, list(prompts["clean_tokens"]), batch_size, counter)
    with counter.part("corrupted"):
        corrupted = last_token_logits(model, list(prompts["corrupted_tokens"]), batch_size, counter)
    scores = score_prompts(clean, prompts)
    scores["corrupted_logit_diff"] = score_prompts(corrupted, prompts)["logit_diff"].to_numpy()
    table = calibration_table(scores, n_bins)
    summary = {
        "logit_diff_mean": float(scores["logit_diff"].mean()),
        "logit_diff_std": float(scores["logit_diff"].std(ddof=1)) if len(scores) > 1 else 0.0,
        "accuracy": float(scores["correct"].mean()),
        "top1_accuracy": float(scores["top1_correct"].mean()),
        "corrupted_logit_diff_mean": float(scores["corrupted_logit_diff"].mean()),
        "expected_calibration_error": expected_calibration_error(table),
        "brier_score": float(((scores["top_prob"] - scores["top1_correct"]) ** 2).mean()),
        "n_prompts": int(len(scores)),
        "prompts_sha256": prompts_hash(prompts),
        **counter.summary(len(prompts)),
    }
    return summary, scores, table


def plot(scores: pd.DataFrame, table: pd.DataFrame, title: str):
    """Logit-difference histogram (clean vs corrupted) beside the reliability diagram."""
    from circuitflow.plots import pyplot

    plt = pyplot()
    fig, (ax_hist, ax_cal) = plt.subplots(1, 2, figsize=(9, 3.5))
    bins = np.histogram_bin_edges(
        np.concatenate([scores["logit_diff"], scores["corrupted_logit_diff"]]), bins=30
    )
    ax_hist.hist(scores["logit_diff"], bins=bins, alpha=0.7, label="clean")
    ax_hist.hist(scores["corrupted_logit_diff"], bins=bins, alpha=0.7, label="corrupted")
    ax_hist.axvline(0, color="k", lw=0.8)
    ax_hist.set_xlabel("logit difference (answer - distractor)")
    ax_hist.set_ylabel("prompts")
    ax_hist.legend()
    filled = table.dropna()
    ax_cal.plot([0, 1], [0, 1], "k--", lw=0.8, label="perfect calibration")
    ax_cal.bar(
        filled["bin_low"],
        filled["accuracy"],
        width=filled["bin_high"] - filled["bin_low"],
        align="edge",
        alpha=0.6,
        edgecolor="k",
        label="top-1 accuracy",
    )
    ax_cal.plot(filled["confidence"], filled["accuracy"], "o", color="C3", label="bin mean")
    ax_cal.set_xlim(0, 1)
    ax_cal.set_ylim(0, 1)
    ax_cal.set_xlabel("confidence (top-token probability)")
    ax_cal.set_ylabel("accuracy")
    ax_cal.legend(loc="upper left", fontsize=8)
    fig.suptitle(title)
    return fig


def run(config: dict, behaviour: str, prompts_path: Path | str, model_json: Path | str,
        out_json: Path | str, out_parquet: Path | str, out_figure: Path | str) -> dict:  # fmt: skip
    """The stage: score one behaviour's prompts and write the summary, rows and figure (the
    model in float32, whatever `model.dtype` says: bf16 would round logit differences)."""
    from circuitflow.devices import precise_math
    from circuitflow.model.load import load_for_analysis, read_model_json
    from circuitflow.prompts import read_prompts

    cfg = BaselineConfig.from_dict(config["baseline"])
    model_dir = Path(model_json).parent
    prompts = read_prompts(prompts_path)
    model = load_for_analysis(model_dir, config["device"])
    with precise_math():
        summary, scores, table = score(model, prompts, cfg)
    summary |= {
        "behaviour": behaviour,
        "model_weights_sha256": read_model_json(model_dir)["weights_sha256"],
    }
    save_figure(out_figure, plot(scores, table, f"{behaviour} baseline"))
    write_parquet(out_parquet, scores)
    write_json(out_json, summary | {"calibration": json_records(table)})
    return summary
