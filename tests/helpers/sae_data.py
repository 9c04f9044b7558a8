"""Shared builders for the SAE tests: a tiny HookedTransformer and real activation files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuitflow.capture.files import write_activation_file
from circuitflow.nodes import hook_name

D_MODEL = 32
CONTEXT_LENGTH = 17  # incl. BOS
BOS = 0


VOCAB = 50
_NEXT = torch.randperm(VOCAB - 1, generator=torch.Generator().manual_seed(123)) + 1


def contexts(n: int, seed: int = 0) -> torch.Tensor:
    """A synthetic language: token t is followed by NEXT[t] with probability 0.8."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.empty((n, CONTEXT_LENGTH), dtype=torch.long)
    toks[:, 0] = BOS
    toks[:, 1] = torch.randint(1, VOCAB, (n,), generator=g)
    for i in range(2, CONTEXT_LENGTH):
        follow = torch.rand(n, generator=g) < 0.8
        rand = torch.randint(1, VOCAB, (n,), generator=g)
        toks[:, i] = torch.where(follow, _NEXT[toks[:, i - 1] - 1], rand)
    return toks


_MODELS: dict[int, dict] = {}


def tiny_model(seed: int = 0) -> HookedTransformer:
    """A 2-layer d_model-32 transformer, briefly trained on the language so CE means something."""
    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=D_MODEL,
        n_ctx=CONTEXT_LENGTH,
        d_head=8,
        n_heads=4,
        d_mlp=64,
        d_vocab=VOCAB,
        act_fn="gelu",
        normalization_type="LN",
        seed=seed,
        device="cpu",
    )
    model = HookedTransformer(cfg)
    if seed not in _MODELS:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for step in range(60):
            loss = model(contexts(64, seed=1000 + step), return_type="loss")
            loss.backward()
            opt.step()
            opt.zero_grad()
        _MODELS[seed] = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(_MODELS[seed])
    return model.eval()


def write_capture(
    model: HookedTransformer,
    path: Path,
    n_contexts: int = 256,
    layer: int = 0,
    site: str = "resid_post",
    complete: bool = True,
    dtype: str = "float16",
) -> Path:
    """Capture `site` at `layer` (nodes.hook_name) with run_with_cache, BOS excluded, as
    capture does."""
    hook = hook_name(site, layer)
    ctx = contexts(n_contexts)
    with torch.no_grad():
        _, cache = model.run_with_cache(ctx, names_filter=hook)
    acts = cache[hook][:, 1:].reshape(-1, model.cfg.d_model).numpy().astype(dtype)
    toks = ctx[:, 1:].reshape(-1).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    attrs = {
        "hook_name": hook,
        "layer": layer,
        "site": site,
        "model_hash": "m0",
        "token_set_hash": "t0",
        "context_length": CONTEXT_LENGTH,
        "bos_excluded": True,
        "bos_token_id": BOS,
    }
    write_activation_file(path, acts, toks, attrs, chunk_rows=512)
    if not complete:
        import h5py

        with h5py.File(path, "r+") as f:
            f.attrs["complete"] = False
    return path


def synthetic_acts(n: int, d: int, n_features: int, k: int, seed: int = 0) -> np.ndarray:
    """Sparse sums of random unit directions: data an SAE can actually recover."""
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((n_features, d)).astype(np.float32)
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    idx = rng.integers(0, n_features, (n, k))
    coef = rng.exponential(1.0, (n, k)).astype(np.float32)
    return np.einsum("nk,nkd->nd", coef, dirs[idx]).astype(np.float32)


# --- one training step, against SAELens's --------------------------------------------------------
D_IN, D_SAE, K = 32, 256, 8  # SAELens's AuxK takes d_in // 2 = 16 dead latents per token


def perturbed_sae(architecture: str, seed: int = 0, hook_out: str = ""):
    """A training SAE (a transcoder into `hook_out` when given) away from its initialisation:
    biases set, decoder rows of unequal norm (so SAELens's decoder-norm rescaling matters)."""
    from circuitflow.sae.architectures import build_training_sae
    from circuitflow.sae.config import SAETrainConfig

    cfg = SAETrainConfig(architecture=architecture, k=K, d_sae=D_SAE)
    torch.manual_seed(seed)
    sae = build_training_sae(cfg, D_IN, "blocks.0.hook_resid_post", "cpu", hook_out)
    with torch.no_grad():
        sae.W_enc.normal_(0, 0.3)
        sae.W_dec.mul_(torch.rand(D_SAE, 1) + 0.5)
        sae.b_dec.normal_()
        sae.b_enc.normal_(0, 0.1)
    return sae


def saelens_step(sae, x: torch.Tensor, dead: torch.Tensor):
    """SAELens's training forward pass of `sae` on `x`, its gradients computed."""
    from sae_lens.saes.sae import TrainStepInput

    out = sae.training_forward_pass(
        TrainStepInput(
            sae_in=x, coefficients={}, dead_neuron_mask=dead, n_training_steps=0,
            is_logging_step=False,
        )
    )  # fmt: skip
    out.loss.backward()
    return out
