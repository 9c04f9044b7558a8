"""Published dictionaries built here, in SAELens's format, for the sae.source pretrained tests:
standard (ReLU), TopK and JumpReLU SAEs whose latents are the signed directions of a random
orthonormal basis (a standard one reconstructs every activation exactly), optionally with
latents that can never fire, written as local directories or laid out as a Hugging Face cache
(no download: `<hub>/models--<org>--<name>/snapshots/<rev>/<folder>/` and `refs/main`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

REVISION = "0123456789abcdef0123456789abcdef01234567"
NEVER = -1.0e4  # the encoder bias of a latent that never fires


def basis(d_in: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d_in, d_in, generator=g, dtype=torch.float64))
    return q.float()


def build(
    architecture: str,
    d_in: int,
    hook: str,
    model_name: str | None = None,
    *,
    seed: int = 0,
    k: int = 4,
    threshold: float = 0.5,
    n_dead: int = 0,
    model_kwargs: dict | None = None,
    **cfg_fields,
):
    """An SAE of `architecture` (standard, topk, jumprelu) with 2 d_in live latents (W_enc =
    [Q, -Q], W_dec its transpose) and `n_dead` that never fire, on `hook`."""
    from sae_lens import (
        JumpReLUSAE,
        JumpReLUSAEConfig,
        StandardSAE,
        StandardSAEConfig,
        TopKSAE,
        TopKSAEConfig,
    )
    from sae_lens.saes.sae import SAEMetadata

    classes = {
        "standard": (StandardSAE, StandardSAEConfig, {}),
        "topk": (TopKSAE, TopKSAEConfig, {"k": k}),
        "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {}),
    }
    sae_cls, cfg_cls, extra = classes[architecture]
    d_sae = 2 * d_in + n_dead
    meta = {"hook_name": hook, "model_name": model_name}
    if model_kwargs is not None:
        meta["model_from_pretrained_kwargs"] = model_kwargs
    cfg = cfg_cls(d_in=d_in, d_sae=d_sae, metadata=SAEMetadata(**meta), **extra, **cfg_fields)
    sae = sae_cls(cfg)
    q = basis(d_in, seed)
    g = torch.Generator().manual_seed(seed + 1)
    w_enc = torch.cat([q, -q, torch.randn(d_in, n_dead, generator=g)], dim=1)
    w_dec = torch.cat([q.T, -q.T, torch.randn(n_dead, d_in, generator=g)], dim=0)
    with torch.no_grad():
        sae.W_enc.copy_(w_enc)
        sae.W_dec.copy_(w_dec)
        sae.b_enc.zero_()
        sae.b_enc[2 * d_in :] = NEVER
        sae.b_dec.zero_()
        if architecture == "jumprelu":
            sae.threshold.fill_(threshold)
    return sae.eval()


def save(sae, directory: Path) -> Path:
    """`sae` as SAELens writes it (cfg.json, sae_weights.safetensors)."""
    sae.save_model(directory)
    return directory


def save_legacy(sae, directory: Path, model_name: str, hook: str) -> Path:
    """`sae` as SAELens < 6 wrote it, as older releases (gpt2-small-res-jb) publish it: the hook
    and model at the top level of cfg.json (hook_point), no metadata, no architecture."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_name": model_name,
        "hook_point": hook,
        "hook_point_layer": int(hook.split(".")[1]),
        "hook_point_head_index": None,
        "d_in": sae.cfg.d_in,
        "d_sae": sae.cfg.d_sae,
        "dtype": "torch.float32",
        "device": "cpu",
        "context_size": 128,
        "prepend_bos": True,
        "dataset_path": "Skylion007/openwebtext",
        "expansion_factor": 32,
        "lr": 0.0004,
    }
    (directory / "cfg.json").write_text(json.dumps(cfg))
    save_file(
        {k: v.contiguous() for k, v in sae.state_dict().items()},
        directory / "sae_weights.safetensors",
    )
    return directory


def lay_out_cache(hub: Path, repo_id: str, saes: dict[str, object], legacy: str | None = None):
    """A Hugging Face hub cache holding `saes` (folder -> SAE) in `repo_id` at REVISION, as
    hf_hub_download leaves it: offline, SAE.from_pretrained finds them there. `legacy`: write
    them as SAELens < 6 did, for that model name (save_legacy)."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    for folder, sae in saes.items():
        if legacy:
            save_legacy(sae, repo / "snapshots" / REVISION / folder, legacy, folder)
        else:
            save(sae, repo / "snapshots" / REVISION / folder)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return repo
