"""Reading a trained SAE directory (SAELens's format), refusing a damaged one in one line."""

from __future__ import annotations

import json
from pathlib import Path

from circuitflow.errors import InputError

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"


def load_sae(sae_dir: Path | str, device="cpu"):
    """The SAE in `sae_dir` (eval mode, parameters frozen, on `device`), after checking its
    cfg.json and weights: InputError naming the file when either is missing or unreadable."""
    from sae_lens import SAE
    from safetensors import safe_open

    sae_dir = Path(sae_dir)
    cfg_path, weights = sae_dir / CFG_FILE, sae_dir / WEIGHTS_FILE
    for path in (cfg_path, weights):
        if not path.is_file():
            raise InputError(f"{path}: missing; rerun train_sae for {sae_dir}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{cfg_path}: not readable JSON ({err})") from None
    if not (cfg.get("metadata") or {}).get("hook_name"):
        raise InputError(f"{cfg_path}: the SAE names no metadata.hook_name")
    try:
        with safe_open(weights, framework="pt") as f:
            names = set(f.keys())
    except Exception as err:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise InputError(f"{weights}: not a readable safetensors file ({err})") from None
    missing = {"W_enc", "W_dec"} - names
    if missing:
        raise InputError(f"{weights}: no {', '.join(sorted(missing))} tensor")
    try:
        sae = SAE.load_from_disk(str(sae_dir), device=str(device)).eval()
    except Exception as err:  # noqa: BLE001 - shapes that disagree with cfg.json, and the like
        raise InputError(f"{sae_dir}: SAELens cannot load this SAE ({err})") from None
    for p in sae.parameters():
        p.requires_grad_(False)
    return sae
