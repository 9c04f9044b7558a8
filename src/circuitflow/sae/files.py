"""Reading a trained SAE directory (SAELens's format), refusing a damaged one in one line."""

from __future__ import annotations

from pathlib import Path

from circuitflow import inputs
from circuitflow.errors import InputError

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"


def check_sae_dir(sae_dir: Path | str) -> dict:
    """The SAE directory's cfg.json, after checking it and the weights' tensor names (no
    SAELens import, so a stage refuses a damaged SAE in a second, before loading its model):
    InputError naming the file when either is missing or unreadable."""
    sae_dir = Path(sae_dir)
    if not sae_dir.is_dir():
        raise InputError(f"{sae_dir}: SAE directory missing; rerun train_sae")
    rerun = f"train_sae for {sae_dir}"
    cfg = inputs.json_file(sae_dir / CFG_FILE, stage=rerun, what="SAELens cfg.json")
    if not (cfg.get("metadata") or {}).get("hook_name"):
        raise InputError(f"{sae_dir / CFG_FILE}: the SAE names no metadata.hook_name")
    weights = sae_dir / WEIGHTS_FILE
    missing = {"W_enc", "W_dec"} - inputs.safetensors_names(weights, stage=rerun)
    if missing:
        raise InputError(f"{weights}: no {', '.join(sorted(missing))} tensor")
    return cfg


def load_sae(sae_dir: Path | str, device="cpu"):
    """The SAE in `sae_dir` (eval mode, parameters frozen, on `device`), after checking its
    cfg.json and weights (check_sae_dir)."""
    check_sae_dir(sae_dir)
    from sae_lens import SAE

    import circuitflow.sae.transcoder  # noqa: F401 - registers TopKTranscoder with SAELens

    try:
        sae = SAE.load_from_disk(str(sae_dir), device=str(device)).eval()
    except Exception as err:  # noqa: BLE001 - shapes that disagree with cfg.json, and the like
        raise InputError(f"{sae_dir}: SAELens cannot load this SAE ({err})") from None
    for p in sae.parameters():
        p.requires_grad_(False)
    return sae
