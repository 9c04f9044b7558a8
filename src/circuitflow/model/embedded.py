"""Train the embedded default model: a small TransformerLens transformer on the synthetic language.

It learns induction (a previous-token head in layer 0 feeding an induction head in layer 1) and
memorised facts, so later stages have circuits with known answers to find.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from circuitflow.devices import enable_fast_math, resolve_device
from circuitflow.io import atomic_path, save_figure, sha256_file, write_json, write_text
from circuitflow.model import load as files
from circuitflow.model.architectures import auto_active_heads
from circuitflow.model.language import MIN_CONTEXT, LanguageConfig, SyntheticLanguage
from circuitflow.schema import schema_defaults, typed

log = logging.getLogger(__name__)
_TOP = schema_defaults()
_ARCH = _TOP["embedded"]["architecture"]
_TRAIN = _TOP["embedded"]["training"]


@dataclass(frozen=True)
class ArchitectureConfig:
    """`embedded.architecture` (defaults: the schema's)."""

    n_layers: int = _ARCH["n_layers"]
    d_model: int = _ARCH["d_model"]
    n_heads: int = _ARCH["n_heads"]
    d_head: int = _ARCH["d_head"]
    d_mlp: int = _ARCH["d_mlp"]
    n_ctx: int = _ARCH["n_ctx"]
    # Shortformer: positions enter only queries and keys, never the residual stream, so the model
    # cannot copy by position arithmetic and learns the classic previous-token + induction heads.
    positional_embedding: str = _ARCH["positional_embedding"]
    # Heads kept per layer after pruning (None: all; "auto": architectures.auto_active_heads).
    # TransformerLens needs one head count for every layer; pruning the rest of a layer lets one
    # induction head carry the mechanism instead of it being smeared over redundant copies.
    active_heads: tuple[int, ...] | str | None = _ARCH["active_heads"]

    def kept_heads(self) -> tuple[int, ...] | None:
        """Heads kept per layer, `auto` resolved."""
        if self.active_heads == "auto":
            return tuple(auto_active_heads(self.n_layers, self.n_heads))
        return self.active_heads


@dataclass(frozen=True)
class TrainingConfig:
    """`embedded.training` (defaults: the schema's)."""

    steps: int = _TRAIN["steps"]
    batch_size: int = _TRAIN["batch_size"]
    lr: float = _TRAIN["lr"]
    weight_decay: float = _TRAIN["weight_decay"]
    warmup_fraction: float = _TRAIN["warmup_fraction"]
    compile: bool = _TRAIN["compile"]
    log_every: int = _TRAIN["log_every"]
    # Group lasso on each head's output weights: heads the language does not need fade out, so
    # each mechanism lives in one head (a crisp, checkable circuit) rather than spread over all.
    head_sparsity: float = _TRAIN["head_sparsity"]
    # When to prune to `architecture.active_heads` (share of steps): late enough that induction
    # has formed with every head available, early enough for the kept heads to take over.
    prune_at: float = _TRAIN["prune_at"]


@dataclass(frozen=True)
class EmbeddedModelConfig:
    """The `embedded` section with the master `seed` and `device` (the language's seed too)."""

    language: LanguageConfig = field(default_factory=LanguageConfig)
    architecture: ArchitectureConfig = field(default_factory=ArchitectureConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    seed: int = _TOP["seed"]
    device: str = _TOP["device"]

    @classmethod
    def from_config(cls, config: dict) -> EmbeddedModelConfig:
        """From the resolved pipeline config (`seed`, `device`, `embedded`)."""
        return typed(
            cls, config["embedded"], "embedded", seed=config["seed"], device=config["device"]
        )


def tl_config(cfg: EmbeddedModelConfig, vocab_size: int) -> dict:
    arch = cfg.architecture
    return dict(
        n_layers=arch.n_layers,
        d_model=arch.d_model,
        n_heads=arch.n_heads,
        d_head=arch.d_head,
        d_mlp=arch.d_mlp,
        n_ctx=arch.n_ctx,
        d_vocab=vocab_size,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type=arch.positional_embedding,
        default_prepend_bos=True,
        tokenizer_prepends_bos=False,
        seed=cfg.seed,
        model_name="circuitflow-embedded",
    )


def _autocast(device: str):
    """bf16 autocast on GPUs that support it; full precision elsewhere."""
    if device == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(cfg: EmbeddedModelConfig, out_dir: Path | str) -> dict:
    """Train, save weights, tokenizer and TransformerLens config, and write `model.json` last."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    if cfg.architecture.n_ctx < MIN_CONTEXT:
        raise ValueError(f"embedded.architecture.n_ctx must be at least {MIN_CONTEXT}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    enable_fast_math(device)
    torch.manual_seed(cfg.seed)
    language = SyntheticLanguage(cfg.language)
    tl_cfg = tl_config(cfg, language.vocab_size)
    model = HookedTransformer(HookedTransformerConfig(**tl_cfg, device=device))
    model.to(device)
    step_model = torch.compile(model) if cfg.training.compile else model

    tr = cfg.training
    optimizer = torch.optim.AdamW(model.parameters(), lr=tr.lr, weight_decay=tr.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=tr.lr, total_steps=tr.steps, pct_start=max(tr.warmup_fraction, 1e-3)
    )
    rng = np.random.default_rng([cfg.seed, 2])
    history = []
    tokens_per_step = tr.batch_size * cfg.architecture.n_ctx
    start = last = time.perf_counter()
    progress = tqdm(range(1, tr.steps + 1), desc="train embedded model", unit="step", mininterval=5)
    masks, prune_step = None, int(tr.prune_at * tr.steps)
    for step in progress:
        batch = torch.from_numpy(language.batch(rng, tr.batch_size, cfg.architecture.n_ctx))
        if step == prune_step and cfg.architecture.kept_heads() is not None:
            masks = head_masks(model, cfg.architecture.kept_heads(), batch.to(device))
            log.info("pruned to %s heads per layer", cfg.architecture.kept_heads())
        with _autocast(device):
            loss = step_model(batch.to(device), return_type="loss")
        objective = loss + tr.head_sparsity * head_group_norm(model) if tr.head_sparsity else loss
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        apply_head_masks(model, masks)
        schedule.step()
        if step % tr.log_every == 0 or step == tr.steps:
            now = time.perf_counter()
            rate = (
                tokens_per_step * (tr.log_every if step % tr.log_every == 0 else 1) / (now - last)
            )
            last = now
            history.append({"step": step, "loss": loss.item(), "tokens_per_s": rate})
            progress.set_postfix(loss=f"{loss.item():.3f}", tokens_per_s=f"{rate:.0f}")
            log.info("step %d/%d  loss %.4f  %.0f tokens/s", step, tr.steps, loss.item(), rate)
    wall = time.perf_counter() - start

    model.eval()
    eval_loss = _eval_loss(model, language, cfg, device)
    weights = out_dir / files.WEIGHTS
    from safetensors.torch import save_file

    with atomic_path(weights) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, tmp)
    language.tokenizer.save_pretrained(out_dir / files.TOKENIZER_DIR)
    write_text(out_dir / "training_history.csv", _history_csv(history))
    _plot_history(history, out_dir / "training_loss.png")
    info = {
        "kind": "embedded",
        "name": "embedded",
        "architecture": files.architecture_of(model.cfg)
        | {"active_heads": cfg.architecture.kept_heads()},
        "tl_config": tl_cfg,
        "language": asdict(cfg.language),
        "training": asdict(cfg.training),
        "seed": cfg.seed,
        "device": device,
        "kept_heads": [m[:, 0, 0].nonzero().flatten().tolist() for m in masks] if masks else None,
        "final_train_loss": history[-1]["loss"],
        "eval_loss": eval_loss,
        "wall_time_s": wall,
        "tokens_per_s": tokens_per_step * tr.steps / wall,
        "weights_sha256": sha256_file(weights),
        "facts": {language.words[s]: language.words[a] for s, a in language.fact_of.items()},
    }
    write_json(out_dir / files.MODEL_JSON, info)
    return info


def head_masks(model, active_heads, batch: torch.Tensor) -> list[torch.Tensor] | None:
    """Per layer, a 0/1 mask over W_O keeping the `active_heads[layer]` heads whose removal hurts
    the loss most on `batch` (importance pruning, as in Michel et al. 2019)."""
    if active_heads is None:
        return None
    masks = []
    with torch.no_grad():
        base = model(batch, return_type="loss").item()
        for block, n_active in zip(model.blocks, active_heads, strict=True):
            importance = []
            for head in range(block.attn.W_O.shape[0]):
                saved = block.attn.W_O[head].clone()
                block.attn.W_O[head] = 0
                importance.append(model(batch, return_type="loss").item() - base)
                block.attn.W_O[head] = saved
            keep = sorted(range(len(importance)), key=lambda h: -importance[h])[:n_active]
            mask = torch.zeros_like(block.attn.W_O)
            mask[keep] = 1
            masks.append(mask)
    return masks


def apply_head_masks(model, masks: list[torch.Tensor] | None) -> None:
    """Project pruned heads' output weights back to zero (after every optimiser step, since
    Adam's momentum would otherwise move them)."""
    if masks is None:
        return
    with torch.no_grad():
        for block, mask in zip(model.blocks, masks, strict=True):
            block.attn.W_O.mul_(mask)


def head_group_norm(model) -> torch.Tensor:
    """Sum over layers and heads of ||W_O[head]||_F (the group-lasso penalty)."""
    return sum(block.attn.W_O.flatten(1).norm(dim=1).sum() for block in model.blocks)


@torch.no_grad()
def _eval_loss(model, language: SyntheticLanguage, cfg: EmbeddedModelConfig, device: str) -> float:
    rng = np.random.default_rng([cfg.seed, 3])
    batch = torch.from_numpy(language.batch(rng, 256, cfg.architecture.n_ctx)).to(device)
    return float(model(batch, return_type="loss"))


def _history_csv(history: list[dict]) -> str:
    lines = ["step,loss,tokens_per_s"]
    lines += [f"{h['step']},{h['loss']:.6f},{h['tokens_per_s']:.1f}" for h in history]
    return "\n".join(lines) + "\n"


def _plot_history(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], marker="o", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title("Embedded model training")
    ax.grid(alpha=0.3)
    save_figure(path, fig)
