"""A tiny Qwen3-architecture Hugging Face model (random weights, norms' weights away from one so
folding them matters) and published transcoders for it laid out as their releases are, so
SAELens's own conversions load them (no download):

- circuit-tracer's Qwen3 transcoders (SAELens conversion `mwhanna_transcoder`, releases
  mwhanna-qwen3-*): one folder holding `layer_{L}.safetensors` (W_enc stored transposed, [d_sae,
  d_model]; W_dec, b_enc, b_dec), `wandb-config.yaml` (d_model, d_feature, batch_size) and
  `config.yaml` (model_name, and circuit-tracer's own keys); ReLU, read at blocks.L.mlp.hook_in
  on a model loaded with fold_ln False, so after the MLP norm's weight;
- Gemma Scope 2's transcoders (conversion `gemma_3`): `transcoder_all/layer_{L}_width_{w}_...`
  folders with `config.json` (architecture jump_relu, model_name, the Hugging Face hooks, the
  affine connection) and `params.safetensors` (w_enc [d_model, d_sae], w_dec, b_enc, b_dec,
  threshold, affine_skip_connection [d_model, d_model]); JumpReLU with a linear skip path, read
  at the MLP norm's output.

gemma_3's conversion prefixes a model name without "google" in it with "google/": the model's
directory is made under a folder named google, and the layouts name it by its path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from helpers.dag import REPO

D_SAE = 48
GEMMA_FOLDER = "transcoder_all/layer_{layer}_width_48_l0_small_affine"


def make_tiny_qwen3(root: Path, seed: int = 0) -> Path:
    """`root`/google/tiny-qwen3: 2 layers, d_model 32, 4 query heads sharing 2 key/value heads,
    head_dim 8, gated MLP 64, q/k norms, the tiny-gpt2 tokenizer (600 tokens)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = root / "google" / "tiny-qwen3"
    tokenizer = REPO / ".test" / "tiny-gpt2"
    config = Qwen3Config(
        vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, rope_theta=10000.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # away from one: folding the weight matters
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, out / name)
    return out


def transcoder_weights(d_model: int, d_sae: int, seed: int, skip: bool) -> dict[str, torch.Tensor]:
    """Random weights of one transcoder (SAELens's orientation: W_enc [d_in, d_sae], W_dec
    [d_sae, d_out], W_skip [d_out, d_in]); encoder biases below zero so a few features fire a
    token (a tenth or so: small graphs)."""
    g = torch.Generator().manual_seed(seed)
    w = {
        "W_enc": torch.randn(d_model, d_sae, generator=g) / d_model**0.5,
        "W_dec": torch.randn(d_sae, d_model, generator=g) * 0.2,
        "b_enc": torch.randn(d_sae, generator=g) * 0.1 - 1.5,
        "b_dec": torch.randn(d_model, generator=g) * 0.1,
        "threshold": torch.rand(d_sae, generator=g) * 0.1,
    }
    if skip:
        w["W_skip"] = torch.randn(d_model, d_model, generator=g) * 0.1
    return w


def lay_out_mwhanna(folder: Path, model_dir: Path, weights: dict[int, dict]) -> Path:
    """circuit-tracer's Qwen3 transcoders' repository layout for `weights` (by layer)."""
    folder.mkdir(parents=True, exist_ok=True)
    d_model, d_sae = next(iter(weights.values()))["W_enc"].shape
    for layer, w in weights.items():
        tensors = {"W_enc": w["W_enc"].T.contiguous(), "W_dec": w["W_dec"], "b_enc": w["b_enc"],
                   "b_dec": w["b_dec"]}  # fmt: skip
        save_file(tensors, folder / f"layer_{layer}.safetensors")
    wandb = {"d_model": {"value": d_model}, "d_feature": {"value": d_sae},
             "batch_size": {"value": 1024}}  # fmt: skip
    (folder / "wandb-config.yaml").write_text(yaml.safe_dump(wandb))
    config = {"model_name": str(model_dir), "model_kind": "transcoder_set",
              "feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out",
              "transcoders": [f"layer_{layer}.safetensors" for layer in weights]}  # fmt: skip
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def lay_out_gemma_scope_2(root: Path, model_dir: Path, weights: dict[int, dict]) -> Path:
    """Gemma Scope 2's transcoder folders (GEMMA_FOLDER) for `weights` (by layer), under
    `root` (the repository's copy)."""
    for layer, w in weights.items():
        folder = root / GEMMA_FOLDER.format(layer=layer)
        folder.mkdir(parents=True, exist_ok=True)
        hf = f"model.layers.{layer}"
        config = {"architecture": "jump_relu", "model_name": str(model_dir),
                  "hf_hook_point_in": f"{hf}.pre_feedforward_layernorm.output",
                  "hf_hook_point_out": f"{hf}.post_feedforward_layernorm.output",
                  "affine_connection": True}  # fmt: skip
        (folder / "config.json").write_text(json.dumps(config))
        tensors = {"w_enc": w["W_enc"], "w_dec": w["W_dec"], "b_enc": w["b_enc"],
                   "b_dec": w["b_dec"], "threshold": w["threshold"],
                   "affine_skip_connection": w["W_skip"].T.contiguous()}  # fmt: skip
        save_file(tensors, folder / "params.safetensors")
    return root


# The shared run's transcoders' Neuronpedia ids (as mwhanna-qwen3-* releases name theirs) and
# the scan its graph files name the set by.
NEURONPEDIA_ID = "tiny-qwen3/{layer}-transcoder-hp"
SCAN = "circuitflow-test/tiny-qwen3-transcoders"


def published_config(model_dir: Path, release: Path) -> dict:
    """circuit-tracer's transcoders on the tiny Qwen3 (sae.kind transcoder, published: a local
    copy of a mwhanna_transcoder release), as config/qwen3-0.6b-transcoders.yaml draws the real
    ones: one behaviour's per-prompt graphs, its transcoders evaluated by one job."""
    return {
        "model": {"name": str(model_dir)},
        "behaviours": {"ioi": {"source": "ioi", "n_prompts": 8}},
        "sites": ["mlp_out"],
        "capture": {"corpus": str(REPO / ".test" / "corpus.txt"), "n_tokens": 1024,
                    "context_length": 32, "dtype": "float32"},
        "sae": {"kind": "transcoder", "source": "pretrained", "eval_contexts": 8,
                "stream": {"layers_per_job": 2},
                "pretrained": {"path": str(release), "format": "mwhanna_transcoder",
                               "sae_id": "layer_{layer}.safetensors",
                               "neuronpedia_id": NEURONPEDIA_ID}},
        # The labels' held-out tokens at the token set's size, not 16,384 (suite time).
        "features": {"n_tokens": 1024, "held_out_tokens": 1024},
        "attribution": {"prompt_graphs": 2, "prompt_graph_scan": SCAN},
    }  # fmt: skip
