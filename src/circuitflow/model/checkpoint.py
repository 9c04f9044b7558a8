"""A TransformerLens checkpoint directory as the model under study (`model.json` kind
`tl_checkpoint`): how researchers keep a toy model they trained with TransformerLens.

    my-model/
      tl_config.json        HookedTransformerConfig fields as JSON (`cfg.to_dict()`)
      weights.safetensors   the state dict; TransformerLens's buffers (`attn.mask`,
                            `attn.IGNORE`, rotary tables) may be left out: the config rebuilds them
      tokenizer/            any Hugging Face tokenizer (`save_pretrained`), word-level included

A directory is one when it holds `tl_config.json`. `shape` reads the config for planning
(no torch); `check` refuses, in one line naming the file and the key, what would fail inside
a job: a missing file, a config TransformerLens rejects, attention that is not causal (the
stages pad batches on the right and read the last real position), a tokenizer larger than the
vocabulary, a tensor whose shape the config does not give. `load` builds the HookedTransformer.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from circuitflow import inputs
from circuitflow.errors import ConfigError, InputError

KIND = "tl_checkpoint"
CONFIG = "tl_config.json"
WEIGHTS = "weights.safetensors"
TOKENIZER = "tokenizer"
LAYOUT = f"{CONFIG}, {WEIGHTS} and {TOKENIZER}/"
# Where the model runs and in what precision are the run's (device, model.dtype), not the file's:
# `cfg.to_dict()` writes them, the first as a torch.dtype no JSON reader turns back into one.
RUNTIME_FIELDS = ("device", "dtype", "n_devices")
REQUIRED = ("n_layers", "d_model", "n_ctx", "d_head")  # HookedTransformerConfig has no default
# The fields a tensor's dimensions come from, to name the one a mismatched shape points at.
SIZE_FIELDS = ("d_vocab", "d_vocab_out", "n_ctx", "d_model", "n_heads", "n_key_value_heads",
               "d_head", "d_mlp")  # fmt: skip
# TransformerLens's buffers (attention's mask and -inf IGNORE, rotary tables): rebuilt from the
# config when the checkpoint loads, whatever the file holds, so never read as weights.
BUFFERS = frozenset({"mask", "IGNORE", "rotary_sin", "rotary_cos"})


def is_buffer(name: str) -> bool:
    """Whether tensor `name` of a checkpoint's weights is one of TransformerLens's BUFFERS."""
    return name.rsplit(".", 1)[-1] in BUFFERS


def is_checkpoint(path: Path | str) -> bool:
    return (Path(path) / CONFIG).is_file()


def neither_kind(path: Path | str) -> str:
    """The line that refuses a model.name directory that is neither local model kind."""
    return (
        f"model.name: directory {path} holds neither config.json (a Hugging Face model) nor "
        f"{CONFIG} (a TransformerLens checkpoint: {LAYOUT})"
    )


def read_fields(model_dir: Path | str) -> dict[str, Any]:
    """The HookedTransformerConfig fields of `model_dir/tl_config.json`, less RUNTIME_FIELDS."""
    try:
        fields = inputs.json_file(Path(model_dir) / CONFIG, what="HookedTransformerConfig fields")
    except InputError as err:  # before any job: a config error
        raise ConfigError(str(err)) from None
    return {k: v for k, v in fields.items() if k not in RUNTIME_FIELDS}


def weight_shapes(path: Path | str) -> dict[str, list[int]]:
    """Each tensor's shape from the safetensors header, without reading the tensors or
    importing torch."""
    header, _ = inputs.safetensors_header(path, ConfigError)
    return {name: entry["shape"] for name, entry in header.items()}


def shape(model_dir: Path | str) -> SimpleNamespace:
    """The shape planning reads (architectures.SHAPE_FIELDS, and attn_only and
    parallel_attn_mlp for the sites a model has), with TransformerLens's defaults where the
    config leaves a field out; an attention-only model's d_mlp is 0. `d_vocab` unset (-1,
    TransformerLens takes the tokenizer's) is read from the embedding's shape."""
    model_dir = Path(model_dir)
    fields, file = read_fields(model_dir), model_dir / CONFIG
    for key in REQUIRED:
        value = fields.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{file}: {key}: {value!r}; HookedTransformerConfig needs it, "
                              "a positive integer")  # fmt: skip
    d_model, attn_only = fields["d_model"], bool(fields.get("attn_only", False))
    d_vocab = fields.get("d_vocab", -1)
    if d_vocab in (-1, None):
        embed = weight_shapes(model_dir / WEIGHTS).get("embed.W_E")
        if not embed:
            raise ConfigError(f"{file}: d_vocab: unset, and {WEIGHTS} has no embed.W_E to read "
                              "it from")  # fmt: skip
        d_vocab = embed[0]
    n_heads = fields.get("n_heads", -1)
    return SimpleNamespace(
        n_layers=fields["n_layers"],
        d_model=d_model,
        n_heads=n_heads if n_heads and n_heads > 0 else d_model // fields["d_head"],
        d_head=fields["d_head"],
        n_key_value_heads=fields.get("n_key_value_heads"),
        d_mlp=0 if attn_only else (fields.get("d_mlp") or 4 * d_model),
        d_vocab=d_vocab,
        n_ctx=fields["n_ctx"],
        gated_mlp=bool(fields.get("gated_mlp", False)),
        normalization_type=fields.get("normalization_type", "LN"),
        positional_embedding_type=fields.get("positional_embedding_type", "standard"),
        act_fn=fields.get("act_fn"),
        attn_only=attn_only,
        parallel_attn_mlp=bool(fields.get("parallel_attn_mlp", False)),
    )


def files(model_dir: Path | str) -> list[Path]:
    """The checkpoint's files, in a fixed order: the config, the weights, the tokenizer's."""
    model_dir = Path(model_dir)
    tokenizer = sorted(p for p in (model_dir / TOKENIZER).rglob("*") if p.is_file())
    return [model_dir / CONFIG, model_dir / WEIGHTS, *tokenizer]


def inputs_of(name: str) -> list[str]:
    """The files of `model.name` where it is a checkpoint (the model stage's inputs), else none."""
    return [str(p) for p in files(name)] if is_checkpoint(name) else []


def fingerprint(model_dir: Path | str) -> str:
    """One SHA-256 over the config, the weights and the tokenizer: what defines the model."""
    # Imported here: circuitflow.config imports this module, and the planner's lightest jobs
    # (RUNTIME_MB["config"]) should not pay for io's hashlib and tempfile.
    from circuitflow.io import sha256_files

    return sha256_files(files(model_dir))


def _missing(model_dir: Path) -> None:
    for name in (CONFIG, WEIGHTS, TOKENIZER):
        path = model_dir / name
        if not (path.is_dir() if name == TOKENIZER else path.is_file()):
            raise ConfigError(f"{path}: missing; a TransformerLens checkpoint directory holds "
                              f"{LAYOUT}")  # fmt: skip


def tl_config(model_dir: Path | str, fields: dict[str, Any] | None = None):
    """The HookedTransformerConfig of the checkpoint; what TransformerLens rejects is one line
    naming tl_config.json and, where its message shows which, the key."""
    from transformer_lens import HookedTransformerConfig

    file = Path(model_dir) / CONFIG
    fields = read_fields(model_dir) if fields is None else fields
    try:
        return HookedTransformerConfig(**fields)
    except TypeError as err:
        msg = str(err)
        if m := re.search(r"unexpected keyword argument '(\w+)'", msg):
            raise ConfigError(f"{file}: {m[1]}: not a HookedTransformerConfig field") from None
        if m := re.search(r"required positional arguments?: (.*)", msg):
            keys = ", ".join(re.findall(r"'(\w+)'", m[1]))
            raise ConfigError(f"{file}: {keys}: HookedTransformerConfig needs it") from None
        raise ConfigError(f"{file}: TransformerLens rejects it ({msg[:200]})") from None
    except (AssertionError, ValueError) as err:
        msg = " ".join(str(err).split())
        # The field the message names first (a message may list values that name others).
        named = {k: m.start() for k in fields if (m := re.search(rf"\b{re.escape(k)}\b", msg))}
        key = min(named, key=named.get) if named else None
        where = f"{key}: {fields[key]!r}: " if key else ""
        raise ConfigError(f"{file}: {where}TransformerLens rejects it ({msg[:200]})") from None


def load_tokenizer(model_dir: Path | str):
    """The checkpoint's tokenizer (tokenizer/), or one line naming the folder."""
    from transformers import AutoTokenizer

    folder = Path(model_dir) / TOKENIZER
    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - transformers raises many types for a bad folder
        raise ConfigError(f"{folder}: not a Hugging Face tokenizer folder ({err})") from None


def check(model_dir: Path | str) -> None:
    """Refuse, in one line naming the file and the key, a checkpoint no stage can run (the
    module's docstring lists what); run before any job."""
    import torch
    from transformer_lens import HookedTransformer

    model_dir = Path(model_dir)
    _missing(model_dir)
    cfg = tl_config(model_dir, read_fields(model_dir) | {"init_weights": False})
    file = model_dir / CONFIG
    if cfg.attention_dir != "causal":
        raise ConfigError(
            f"{file}: attention_dir: {cfg.attention_dir!r}; the stages pad batches on the right "
            "and read each prompt's last position, which needs causal attention"
        )
    tokenizer = load_tokenizer(model_dir)
    vocab = max(tokenizer.get_vocab().values()) + 1
    if cfg.d_vocab != -1 and vocab > cfg.d_vocab:
        raise ConfigError(f"{file}: d_vocab: {cfg.d_vocab}, and {model_dir / TOKENIZER} has ids "
                          f"up to {vocab - 1}: the embedding has no row for them")  # fmt: skip
    found = weight_shapes(model_dir / WEIGHTS)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    want = _parameter_shapes(model)
    buffers = {name for name, _ in model.named_buffers()}
    weights = model_dir / WEIGHTS
    for name in want:
        if name not in found:
            raise ConfigError(f"{weights}: no tensor {name}, which the model {file} describes "
                              "has")  # fmt: skip
    for name in found:
        if name not in want and name not in buffers:
            raise ConfigError(f"{weights}: {name} is not a tensor of the model {file} describes "
                              "(attn_only, normalization_type, gated_mlp, ...?)")  # fmt: skip
    for name, dims in want.items():  # in the model's order: the first mismatch TL would meet
        if found[name] != dims:
            field = _field_of(model.cfg, name, found[name], dims)
            key = f"{field}: {getattr(model.cfg, field)}" if field else "its fields"
            raise ConfigError(f"{file}: {key} makes {name} {dims}; {weights} holds "
                              f"{found[name]}")  # fmt: skip


def _parameter_shapes(model) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in model.named_parameters()}


def _field_of(cfg, name: str, found: list[int], want: list[int]) -> str | None:
    """The config field that sets the dimension of tensor `name` where the file (`found`) and
    the config (`want`) disagree: of the fields of that size, the one that moves it when
    changed by one (a meta model each, no memory); None when the ranks differ or none does."""
    import dataclasses

    import torch
    from transformer_lens import HookedTransformer

    if len(found) != len(want):
        return None
    axis = next(i for i, (a, b) in enumerate(zip(found, want, strict=True)) if a != b)
    for field in SIZE_FIELDS:
        if getattr(cfg, field, None) != want[axis]:
            continue
        try:
            with torch.device("meta"):
                moved = HookedTransformer(
                    dataclasses.replace(cfg, **{field: want[axis] + 1}), move_to_device=False
                )
        except Exception:  # noqa: BLE001, S112 - a change the config refuses: not this field
            continue
        if _parameter_shapes(moved)[name][axis] == want[axis] + 1:
            return field
    return None


def verify(model_dir: Path | str, weights_sha256: str) -> None:
    """Refuse a checkpoint whose files changed since the model stage hashed them (model.json's
    `weights_sha256`)."""
    _missing(Path(model_dir))
    if fingerprint(model_dir) != weights_sha256:
        raise InputError(
            f"{model_dir}: not the checkpoint the model stage described (SHA-256 of {LAYOUT} "
            "differs: changed since); rerun the model stage"
        )


def load(model_dir: Path | str):
    """The checkpoint as a HookedTransformer in float32 on the CPU, its buffers rebuilt from the
    config."""
    model_dir = Path(model_dir)
    tensors = inputs.safetensors_file(model_dir / WEIGHTS)
    from transformer_lens import HookedTransformer

    cfg = tl_config(model_dir, read_fields(model_dir) | {"init_weights": False})
    model = HookedTransformer(
        cfg, tokenizer=load_tokenizer(model_dir), move_to_device=False, default_padding_side="right"
    )
    buffers = {name for name, _ in model.named_buffers()}
    params = {k: v for k, v in tensors.items() if k not in buffers}
    missing, unexpected = model.load_state_dict(params, strict=False)
    missing = [k for k in missing if k not in buffers]
    if missing or unexpected:
        what = f"no tensor {missing[0]}" if missing else f"{unexpected[0]}, not a tensor"
        raise InputError(f"{model_dir / WEIGHTS}: {what} of the model {CONFIG} describes")
    return model
