"""Load the model under study as a TransformerLens `HookedTransformer`.

Three kinds, recorded in `model/model.json` under `kind`:

* `embedded`: trained by the pipeline (see `model.embedded`), weights in safetensors;
* `transformer_lens`: a TransformerLens model name, weights pre-fetched into the Hugging Face
  cache on a machine with internet, loaded offline in stage jobs;
* `local_hf`: a local Hugging Face model directory;
* `tl_checkpoint`: a TransformerLens checkpoint directory (config, safetensors weights and a
  tokenizer; `model.checkpoint`), read where it lies: nothing to fetch.

Real models load without TransformerLens's weight processing (no LayerNorm folding or
centering), so the activations we capture are the Hugging Face model's own and reduced-precision
weights are not reprocessed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from circuitflow import inputs
from circuitflow.errors import ConfigError, InputError
from circuitflow.io import sha256_file, sha256_files
from circuitflow.model import checkpoint
from circuitflow.model.architectures import hf_field, n_params

if TYPE_CHECKING:  # imported where a model loads: the model stage of a local directory needs none
    import torch

MODEL_JSON = "model.json"
WEIGHTS = "weights.safetensors"
TOKENIZER_DIR = "tokenizer"
NO_PROCESSING = dict(
    fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
)


def official_model_name(name: str) -> str:
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        return get_official_model_name(name)
    except ValueError:
        raise ConfigError(
            f"model.name: {name!r} is neither 'embedded', a TransformerLens model name "
            "(e.g. gpt2, Qwen/Qwen2.5-0.5B) nor a local directory with config.json (a Hugging "
            f"Face model) or {checkpoint.CONFIG} (a TransformerLens checkpoint)"
        ) from None


def remote_n_layers(official_name: str) -> int | None:
    """Layer count from the Hugging Face config (the cache, or the hub where reachable)."""
    try:
        from transformers import AutoConfig

        hf_cfg = AutoConfig.from_pretrained(official_name)
    except Exception:  # noqa: BLE001 - offline and not cached: the caller explains what to do
        return None
    return hf_field(hf_cfg.to_dict(), "n_layers")


def read_model_json(model_dir: Path | str) -> dict:
    path = Path(model_dir) / MODEL_JSON
    keys = ("kind", "architecture", "weights_sha256")
    return inputs.json_file(path, keys, stage="the model stage", what="model.json")


def architecture_of(cfg) -> dict:
    """The architecture fields worth recording from a HookedTransformerConfig."""
    fields = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn")
    return {f: getattr(cfg, f) for f in fields} | {"n_params": int(cfg.n_params or 0)}


def _apply_hf_home(hf_cache: str | None) -> None:
    if hf_cache:
        os.environ["HF_HOME"] = str(Path(hf_cache).expanduser())


def load_for_analysis(model_dir: Path | str, device: str = "auto"):
    """The model in float32, whatever `model.dtype` says: every stage that measures (baseline,
    SAE evaluation, attribution, interventions) reads its numbers from this one. The models
    here are at most 0.5B parameters, so float32 costs little; `model.dtype` governs capture.
    Callers compute under devices.precise_math() (no TF32)."""
    return load_model(model_dir, device, "float32", fast_math=False)


def load_model(model_dir: Path | str, device: str = "auto", dtype: str = "auto",
               fast_math: bool = True):  # fmt: skip
    """The model described by `model_dir/model.json`, in eval mode, on `device`; `fast_math`
    turns on TF32 matmuls on GPUs (throughput work only)."""
    model_dir = Path(model_dir)
    info = read_model_json(model_dir)
    kind = info["kind"]
    # Damaged inputs are refused before TransformerLens's ~10 s import.
    weights = embedded_weights(model_dir, info) if kind == "embedded" else None
    if kind == checkpoint.KIND:
        checkpoint.verify(info["path"], info["weights_sha256"])
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuitflow.devices import enable_fast_math, resolve_device, resolve_dtype

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    if fast_math:
        enable_fast_math(device)
    if kind == "embedded":
        from transformers import PreTrainedTokenizerFast

        cfg = HookedTransformerConfig(**info["tl_config"])
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir / TOKENIZER_DIR)
        model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="right")
        model.load_state_dict(weights)
        model.to(torch_dtype)
        model.to(device)
    elif kind == "transformer_lens":
        _apply_hf_home(info.get("hf_cache"))
        model = HookedTransformer.from_pretrained(
            info["official_name"], device=device, dtype=torch_dtype, **NO_PROCESSING
        )
    elif kind == "local_hf":
        model = load_local_hf(info["path"], device, torch_dtype)
    elif kind == checkpoint.KIND:
        model = checkpoint.load(info["path"]).to(torch_dtype).to(device)
    else:
        raise InputError(f"{model_dir / MODEL_JSON}: unknown model kind {kind!r}")
    model.eval()
    return model


def embedded_weights(model_dir: Path, info: dict) -> dict[str, torch.Tensor]:
    """The embedded model's weights, refusing in one line a missing or damaged file, one that
    is not the file model.json describes (its SHA-256), or a missing tokenizer."""
    path = model_dir / WEIGHTS
    tensors = inputs.safetensors_file(path, stage="the model stage")
    if sha256_file(path) != info["weights_sha256"]:
        raise InputError(
            f"{path}: not the weights {model_dir / MODEL_JSON} describes (SHA-256 differs: "
            "changed or damaged since the model stage); rerun the model stage"
        )
    inputs.existing_file(model_dir / TOKENIZER_DIR / "tokenizer.json", stage="the model stage")
    return tensors


def load_local_hf(path: str | Path, device: str, dtype: torch.dtype):
    """A local Hugging Face directory as a HookedTransformer.

    TransformerLens's `from_pretrained` insists on an official model name; its lower-level
    loaders do accept a directory, so we assemble the model from them.
    """
    from transformer_lens import HookedTransformer
    from transformer_lens import loading_from_pretrained as loading
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(Path(path).resolve())
    cfg = loading.get_pretrained_model_config(path, device=device, dtype=dtype)
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    state_dict = loading.get_pretrained_state_dict(path, cfg, hf_model, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    model.load_and_process_state_dict(state_dict, **NO_PROCESSING)
    del hf_model
    return model.to(device)


def prefetch(name: str, hf_cache: str | None = None) -> dict:
    """Make a real model available offline and describe it for `model.json`.

    Runs on the login node (internet); stage jobs then load with the hub offline. Every
    weight file is checked for NaN and infinite values first (check_finite): no job reads the
    weights before this stage.
    """
    local = Path(name)
    if checkpoint.is_checkpoint(local):
        check_finite([local / checkpoint.WEIGHTS], skip=checkpoint.is_buffer)
        return describe_checkpoint(local, name)
    _apply_hf_home(hf_cache)
    if local.exists():
        if not (local / "config.json").is_file():
            raise ConfigError(checkpoint.neither_kind(local))
        weights = sorted(local.glob("*.safetensors")) or sorted(local.glob("*.bin"))
        check_finite(weights)  # before TransformerLens's import (seconds)
        from transformer_lens import loading_from_pretrained as loading

        cfg = loading.get_pretrained_model_config(str(local.resolve()))
        return {
            "kind": "local_hf",
            "name": name,
            "path": str(local.resolve()),
            "architecture": architecture_of(cfg),
            "weights_sha256": sha256_files(weights),
        }
    from huggingface_hub import snapshot_download
    from transformer_lens import loading_from_pretrained as loading

    official = official_model_name(name)
    snapshot = Path(
        snapshot_download(
            official,
            allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*"],
        )
    )
    weights = sorted(snapshot.glob("*.safetensors"))
    check_finite(weights)
    cfg = loading.get_pretrained_model_config(official)
    return {
        "kind": "transformer_lens",
        "name": name,
        "official_name": official,
        "snapshot": str(snapshot),
        "hf_cache": hf_cache,
        "architecture": architecture_of(cfg),
        "weights_sha256": sha256_files(weights),
    }


def check_finite(weights: list[Path], key: str = "model.name", skip=None) -> None:
    """Refuse, in one line naming the file and the tensor, model weights holding NaN or
    infinite values: the model stage reads every weight file (it hashes them), and no job reads
    them before it. Safetensors files tensor by tensor in bounded chunks (inputs.nonfinite, no
    torch); a PyTorch .bin through a memory map, one tensor at a time. `skip`: tensors not read
    as weights (a TransformerLens checkpoint's buffers, rebuilt when it loads)."""
    for path in weights:
        if path.suffix == ".safetensors":
            inputs.finite_weights([path], key, ConfigError, skip)
        elif found := _nonfinite_bin(path):
            raise ConfigError(f"{key}: {inputs.nonfinite_line(path, found)}")


def _nonfinite_bin(path: Path) -> tuple[str, int, int] | None:
    """nonfinite (inputs) of a PyTorch state dict file, mapped rather than read whole."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as err:  # noqa: BLE001 - a damaged or non-zip file: many kinds
        raise ConfigError(
            f"model.name: {path}: not a readable PyTorch weights file ({err})"
        ) from None
    for name, tensor in state.items():
        if not (torch.is_tensor(tensor) and tensor.is_floating_point()):
            continue
        flat, nan, inf = tensor.reshape(-1), 0, 0
        for at in range(0, flat.numel(), 1 << 24):
            chunk = flat[at : at + (1 << 24)]
            nan += int(torch.isnan(chunk).sum())
            inf += int(torch.isinf(chunk).sum())
        if nan or inf:
            return name, nan, inf
    return None


def describe_checkpoint(model_dir: Path, name: str) -> dict:
    """A TransformerLens checkpoint's model.json, from its files alone: nothing to fetch, no
    TransformerLens (config.resolve checked it before any job)."""
    shape = checkpoint.shape(model_dir)
    fields = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn",
              "normalization_type", "attn_only")  # fmt: skip
    return {
        "kind": checkpoint.KIND,
        "name": name,
        "path": str(model_dir.resolve()),
        "architecture": {f: getattr(shape, f) for f in fields} | {"n_params": n_params(shape)},
        "tl_config": checkpoint.read_fields(model_dir),
        "weights_sha256": checkpoint.fingerprint(model_dir),
    }


def load_tokenizer(model_dir: Path | str):
    """The model's tokenizer alone (no weights), for building prompts."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    info = read_model_json(model_dir)
    if info["kind"] == "embedded":
        return PreTrainedTokenizerFast.from_pretrained(Path(model_dir) / TOKENIZER_DIR)
    if info["kind"] == checkpoint.KIND:
        return checkpoint.load_tokenizer(info["path"])
    return AutoTokenizer.from_pretrained(info.get("snapshot") or info["path"])


def prefetch_stage(config: dict, out: Path | str) -> dict:
    """Rule prefetch_model: fetch the configured model and write its model.json to `out`."""
    from circuitflow.io import write_json

    model = config["model"]
    info = prefetch(model["name"], model["hf_cache"]) | {"dtype": model["dtype"]}
    write_json(out, info)
    return info
