"""Training checkpoints: tensors in safetensors, small state in JSON, written atomically.

Layout: ``{root}/step_{n:09d}/{tensors.safetensors,state.json}``. ``state.json`` carries the
SHA-256 of the tensor file, so truncation or bit rot is detected before anything is loaded.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from circuitflow.errors import CheckpointError
from circuitflow.io import atomic_dir, sha256_file

FORMAT_VERSION = 1
TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"


def save_checkpoint(
    root: Path, step: int, tensors: dict[str, torch.Tensor], state: dict[str, Any], keep: int = 2
) -> Path:
    """Write checkpoint ``step`` under ``root`` and prune all but the newest ``keep``."""
    final = root / f"step_{step:09d}"
    with atomic_dir(final) as tmp:
        # safetensors refuses shared or non-contiguous storage; clone keeps live tensors intact.
        tensors = {k: v.detach().contiguous().clone().cpu() for k, v in tensors.items()}
        save_file(tensors, tmp / TENSORS_FILE)
        meta = {
            "format": FORMAT_VERSION,
            "step": step,
            "tensors_sha256": sha256_file(tmp / TENSORS_FILE),
            "state": state,
        }
        with open(tmp / STATE_FILE, "w") as f:
            json.dump(meta, f, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoint directories under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Verify and load one checkpoint; raise CheckpointError naming the path if it is damaged."""
    state_path, tensor_path = path / STATE_FILE, path / TENSORS_FILE
    try:
        with open(state_path) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint state ({exc}); delete it") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: unknown checkpoint format; delete it")
    if not tensor_path.is_file() or sha256_file(tensor_path) != meta.get("tensors_sha256"):
        raise CheckpointError(
            f"{path}: checkpoint tensors are missing, truncated or corrupt "
            "(checksum mismatch); delete it"
        )
    try:
        tensors = load_file(tensor_path)
    except Exception as exc:  # safetensors raises several types for malformed headers
        raise CheckpointError(f"{path}: cannot read checkpoint tensors ({exc})") from exc
    return tensors, meta["state"]


def set_aside(path: Path) -> Path:
    """Move a damaged checkpoint out of the way (kept for inspection, never loaded again):
    ``{root}/corrupt/step_n`` (``step_n.1``, ... when that name is taken)."""
    target = path.parent / "corrupt" / path.name
    n = 0
    while target.exists():
        n += 1
        target = path.parent / "corrupt" / f"{path.name}.{n}"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, target)
    return target


def latest_checkpoint(root: Path) -> Path | None:
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def optimizer_to_flat(opt_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
    """Split a torch optimizer state_dict into safetensors-able tensors and JSON state."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, pstate in opt_state["state"].items():
        for name, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{name}"] = value
            else:
                scalars.setdefault(str(idx), {})[name] = value
    return tensors, {"param_groups": opt_state["param_groups"], "scalars": scalars}


def optimizer_from_flat(tensors: dict[str, torch.Tensor], json_state: dict) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for idx, extra in json_state["scalars"].items():
        state.setdefault(int(idx), {}).update(extra)
    return {"state": state, "param_groups": json_state["param_groups"]}
