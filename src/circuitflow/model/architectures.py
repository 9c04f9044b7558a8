"""Model shapes: the real models' architectures as TransformerLens configs (no download), and
the shape of any model read from its Hugging Face config.json, in one place.

The GPU benchmarks build GPT-2 small and Qwen2.5-0.5B with random weights (identical compute and
memory to the real models); the memory planner's GPU presets and the job resources size work
for them. The values are the ones TransformerLens derives from the Hugging Face configs (`gpt2`,
`Qwen/Qwen2.5-0.5B`) when the pipeline loads the real weights without weight processing
(load.NO_PROCESSING), so LayerNorm stays LN and the unembedding is a separate matrix (Qwen's tied
embedding is untied there too).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from circuitflow.model import checkpoint

if TYPE_CHECKING:  # imported where a model is built: planning needs only the shapes
    import torch


# Each architecture's TransformerLens config fields.
GPT2_SMALL = {
    "n_layers": 12,
    "d_model": 768,
    "n_heads": 12,
    "d_head": 64,
    "d_mlp": 3072,
    "n_ctx": 1024,
    "d_vocab": 50257,
    "act_fn": "gelu_new",
    "normalization_type": "LN",
    "positional_embedding_type": "standard",
    "eps": 1e-5,
    "original_architecture": "GPT2LMHeadModel",
}
QWEN25_05B = {
    "n_layers": 24,
    "d_model": 896,
    "n_heads": 14,
    "n_key_value_heads": 2,
    "d_head": 64,
    "d_mlp": 4864,
    "n_ctx": 32768,
    "d_vocab": 151936,
    "act_fn": "silu",
    "gated_mlp": True,
    "normalization_type": "RMS",
    "final_rms": True,
    "positional_embedding_type": "rotary",
    "rotary_dim": 64,
    "rotary_base": 1_000_000,
    "rotary_adjacent_pairs": False,
    "use_attn_scale": True,
    "eps": 1e-6,
    "initializer_range": 0.02,
    "original_architecture": "Qwen2ForCausalLM",
}


# The published transcoders' ready configs' models, planned from their shapes alone (as
# TransformerLens loads them without weight processing; its Qwen3 from the Hugging Face config,
# its Gemma 3 270M from its own table): no GPU suite measures them, so they are not
# ARCHITECTURES, only shapes a dry run plans memory and walltime with before any download.
QWEN3_06B = {
    "n_layers": 28,
    "d_model": 1024,
    "n_heads": 16,
    "n_key_value_heads": 8,
    "d_head": 128,
    "d_mlp": 3072,
    "n_ctx": 40960,
    "d_vocab": 151936,
    "act_fn": "silu",
    "gated_mlp": True,
    "normalization_type": "RMS",
    "positional_embedding_type": "rotary",
    "original_architecture": "Qwen3ForCausalLM",
}
GEMMA3_270M = {
    "n_layers": 18,
    "d_model": 640,
    "n_heads": 4,
    "n_key_value_heads": 1,
    "d_head": 256,
    "d_mlp": 2048,
    "n_ctx": 8192,
    "d_vocab": 262144,
    "act_fn": "gelu_pytorch_tanh",
    "gated_mlp": True,
    "normalization_type": "RMS",
    "positional_embedding_type": "rotary",
    "original_architecture": "Gemma3ForCausalLM",
}
# model.name spellings (lower case) -> those shapes.
KNOWN_SHAPES = {
    "qwen/qwen3-0.6b": QWEN3_06B,
    "qwen3-0.6b": QWEN3_06B,
    "google/gemma-3-270m": GEMMA3_270M,
    "gemma-3-270m": GEMMA3_270M,
}


def gpt2_small(**overrides: Any):
    """GPT-2 small (124M): 12 layers, d_model 768, 12 heads, MLP 3072, vocabulary 50257."""
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(**{**GPT2_SMALL, **overrides})


def qwen25_05b(**overrides: Any):
    """Qwen2.5-0.5B: 24 layers, d_model 896, 14 query heads sharing 2 key/value heads (GQA),
    d_head 64, SwiGLU MLP 4864, RMSNorm, rotary positions, vocabulary 151936."""
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(**{**QWEN25_05B, **overrides})


ARCHITECTURES = {"gpt2-small": gpt2_small, "qwen2.5-0.5b": qwen25_05b}
FIELDS = {"gpt2-small": GPT2_SMALL, "qwen2.5-0.5b": QWEN25_05B}
# model.name spellings (lower case) of the pipeline's configs -> architecture key.
MODEL_NAMES = {
    "gpt2": "gpt2-small",
    "gpt2-small": "gpt2-small",
    "qwen/qwen2.5-0.5b": "qwen2.5-0.5b",
    "qwen2.5-0.5b": "qwen2.5-0.5b",
}


def architecture_key(model_name: str) -> str | None:
    """The architecture key of a config's `model.name`, or None for other models."""
    return MODEL_NAMES.get(str(model_name).lower())


def official_name(model_name: str) -> str | None:
    """TransformerLens's official name for `model_name` (a hub name or one of its aliases,
    any case), or None where it has none: get_official_model_name's answer, from the same
    table (transformer_lens/supported_models.py, data alone) read without importing
    TransformerLens, which would cost every Snakemake process of such a config about 10 s of
    CPU just to compare two names (tests/model check it against TransformerLens's own)."""
    return _alias_map().get(str(model_name).lower())


@functools.cache
def _alias_map() -> dict[str, str]:
    import importlib.util

    spec = importlib.util.find_spec("transformer_lens")  # finds the package, runs nothing
    folder = spec.submodule_search_locations if spec else None
    table = Path(next(iter(folder))) / "supported_models.py" if folder else None
    if table is None or not table.is_file():  # another layout: the package's own import
        from transformer_lens import supported_models as module
    else:
        loaded = importlib.util.spec_from_file_location("_tl_supported_models", table)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    # make_model_alias_map's map: each alias, and the name itself, to the official name
    out = {}
    for name in module.OFFICIAL_MODEL_NAMES:
        for alias in module.MODEL_ALIASES.get(name, []):
            out[alias.lower()] = name
        out[name.lower()] = name
    return out


def config(name: str, **overrides: Any):
    """The HookedTransformerConfig of architecture `name` (a key of ARCHITECTURES)."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name](**overrides)


# The fields planning reads (n_params, the memory planner, FLOPs), with TransformerLens's
# defaults where an architecture leaves one out.
SHAPE_DEFAULTS = {"n_key_value_heads": None, "gated_mlp": False}
SHAPE_FIELDS = (
    "n_layers", "d_model", "n_heads", "d_head", "n_key_value_heads", "d_mlp", "d_vocab", "n_ctx",
    "gated_mlp", "normalization_type", "positional_embedding_type", "act_fn",
)  # fmt: skip


def shape(name: str) -> SimpleNamespace:
    """Architecture `name`'s shape as planning reads it (SHAPE_FIELDS), without
    TransformerLens: its import (about 5 s of CPU) would be paid by every dry run of a real
    model's config and every job that plans one (tests/model check it against `config`)."""
    if name not in FIELDS:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(FIELDS)}")
    fields = SHAPE_DEFAULTS | FIELDS[name]
    return SimpleNamespace(**{k: fields[k] for k in SHAPE_FIELDS})


def build(
    name: str, device: str = "cpu", dtype: torch.dtype | None = None, seed: int = 0, **overrides
):
    """A HookedTransformer of architecture `name` with random weights, in eval mode, in float32
    unless `dtype` says (`overrides`: fields of its config, such as n_layers for a smoke test)."""
    import torch
    from transformer_lens import HookedTransformer

    dtype = torch.float32 if dtype is None else dtype

    cfg = config(name, device=device, dtype=dtype, seed=seed, **overrides)
    return HookedTransformer(cfg).eval()


def n_params(cfg) -> int:
    """Parameters of a HookedTransformer built from `cfg` (embedding and unembedding included),
    counted from the shapes, so no model has to be built."""
    d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    kv = getattr(cfg, "n_key_value_heads", None) or h
    m = cfg.d_mlp
    norm = {"LN": 2, "LNPre": 0, "RMS": 1, "RMSPre": 0}.get(cfg.normalization_type or "", 0)
    attn = d * h * dh * 2 + h * dh + d + 2 * (d * kv * dh + kv * dh)  # Q, O; K, V (GQA)
    mlp = d * m * (3 if cfg.gated_mlp else 2) + m + d
    per_layer = attn + mlp + 2 * norm * d
    if getattr(cfg, "attn_only", False):  # one norm a layer, before the heads
        per_layer = attn + norm * d
    pos = cfg.n_ctx * d if cfg.positional_embedding_type == "standard" else 0
    unembed = d * cfg.d_vocab + cfg.d_vocab
    return cfg.n_layers * per_layer + cfg.d_vocab * d + pos + norm * d + unembed


def matmul_params_per_layer(cfg) -> int:
    """Weights one token multiplies through in one block (attention projections and MLP)."""
    d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    kv = getattr(cfg, "n_key_value_heads", None) or h
    return 2 * d * h * dh + 2 * d * kv * dh + d * cfg.d_mlp * (3 if cfg.gated_mlp else 2)


# Hugging Face config.json field names, in the order they are tried, per shape field.
HF_FIELDS = {
    "n_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_heads": ("num_attention_heads", "n_head", "n_heads"),
    "n_key_value_heads": ("num_key_value_heads",),
    "d_mlp": ("intermediate_size", "n_inner", "ffn_dim"),
    "d_vocab": ("vocab_size",),
    "n_ctx": ("max_position_embeddings", "n_positions", "n_ctx"),
}
# Families with a gated (SwiGLU) MLP, RMSNorm and rotary positions, as TransformerLens loads them.
GATED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo"})


def hf_field(hf: dict, name: str) -> int | None:
    """A shape field of a Hugging Face config dict, or None when it names none of its keys."""
    for key in HF_FIELDS[name]:
        if hf.get(key) is not None:
            return int(hf[key])
    return None


def read_hf_config(model_dir: Path | str) -> dict:
    """config.json of a local Hugging Face model directory."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def from_hf_config(hf: dict):
    """The shape fields n_params and the memory planner read, from a Hugging Face config dict
    (missing ones take GPT-2-like values)."""
    d = hf_field(hf, "d_model") or 768
    heads = hf_field(hf, "n_heads") or max(1, d // 64)
    gated = hf.get("model_type") in GATED_MODEL_TYPES
    return SimpleNamespace(
        n_layers=hf_field(hf, "n_layers") or 12,
        d_model=d,
        n_heads=heads,
        d_head=d // heads,
        n_key_value_heads=hf_field(hf, "n_key_value_heads"),
        d_mlp=hf_field(hf, "d_mlp") or 4 * d,
        d_vocab=hf_field(hf, "d_vocab") or 50257,
        n_ctx=hf_field(hf, "n_ctx") or 1024,
        gated_mlp=gated,
        normalization_type="RMS" if gated else "LN",
        positional_embedding_type="rotary" if gated else "standard",
        act_fn="silu" if gated else "gelu_new",
    )


def auto_active_heads(n_layers: int, n_heads: int) -> list[int]:
    """The embedded model's `active_heads: auto`: two heads in layer 0 (a previous-token head and
    one more), one in every later layer (an induction head needs one), so each planted mechanism
    lives in one head."""
    return [min(2, n_heads)] + [1] * (n_layers - 1)


# --- a pipeline config's model shape, without loading the model (resources, memory) ---------
@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    d_model: int
    d_mlp: int
    vocab: int
    n_params: int


def _shape(cfg) -> ModelShape:
    return ModelShape(cfg.n_layers, cfg.d_model, cfg.d_mlp, cfg.d_vocab, n_params(cfg))


def model_shape(pipeline_config: dict) -> ModelShape:
    """The shape of the model a pipeline config names, without loading it (see model_cfg)."""
    return _shape(model_cfg(pipeline_config))


def model_cfg(pipeline_config: dict):
    """The TransformerLens-like config of the model a pipeline config names, without loading it:
    the embedded model's architecture, a TransformerLens checkpoint's tl_config.json, a local
    directory's config.json, a known real architecture, else `model.n_layers` with a
    GPT-2-medium-like width."""
    model = pipeline_config["model"]
    if model["name"] == "embedded":
        arch = pipeline_config["embedded"]["architecture"]
        lang = pipeline_config["embedded"]["language"]
        # Random tokens, subjects, attributes and a few specials: a tiny vocabulary.
        vocab = lang["n_random_tokens"] + lang["n_subjects"] + lang["n_attributes"] + 16
        cfg = SimpleNamespace(
            **{k: arch[k] for k in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx")},
            d_vocab=vocab,
            gated_mlp=False,
            normalization_type="LN",
            positional_embedding_type="shortformer",
        )
        return cfg
    if checkpoint.is_checkpoint(model["name"]):
        return checkpoint.shape(model["name"])
    if (Path(model["name"]) / "config.json").is_file():
        return from_hf_config(read_hf_config(model["name"]))
    key = architecture_key(model["name"])
    if key:
        return shape(key)
    if known := KNOWN_SHAPES.get(str(model["name"]).lower()):
        fields = SHAPE_DEFAULTS | known
        return SimpleNamespace(**{k: fields[k] for k in SHAPE_FIELDS})
    n_layers = model["n_layers"] or max(pipeline_config["layers"]) + 1
    hf = {"n_layer": n_layers, "n_embd": 1024, "n_head": 16, "n_inner": 4096}
    return from_hf_config(hf)
