"""Per-rule job resources (src/circuitflow/resources.py): GPUs, CPUs, memory, walltime."""

from __future__ import annotations

import copy

import yaml
from helpers.dag import REPO

from circuitflow import config as cf_config
from circuitflow import resources
from circuitflow.model import architectures

EMBEDDED = cf_config.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))


def _real(name: str, n_layers: int) -> dict:
    cfg = copy.deepcopy(EMBEDDED)
    cfg["model"] = {**cfg["model"], "name": name, "n_layers": n_layers}
    return cfg


def test_parameter_counts_are_those_of_the_built_models():
    """architectures.n_params against HookedTransformers built from the same configs (2 layers
    and a small vocabulary, so they build fast): gated MLP and grouped-query attention count."""
    from transformer_lens import HookedTransformer

    for name in architectures.ARCHITECTURES:
        cfg = architectures.config(name, n_layers=2, d_vocab=1000)
        built = sum(p.numel() for p in HookedTransformer(cfg).parameters())
        assert architectures.n_params(cfg) == built, name


def test_model_shape_of_every_kind_of_model(tiny_hf_model_dir):
    assert architectures.model_shape(EMBEDDED).d_model == 64
    for name, key in (("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b"), ("gpt2", "gpt2-small")):
        shape = architectures.model_shape(_real(name, 24))
        assert shape.n_params == architectures.n_params(architectures.config(key)), name
    # Qwen2.5-0.5B as loaded (untied unembedding): 630.5M, not the 558.5M that ignored the
    # gated MLP and grouped-query attention.
    assert architectures.model_shape(_real("Qwen/Qwen2.5-0.5B", 24)).n_params == 630_479_104
    local = architectures.model_shape(_real(str(tiny_hf_model_dir), 2))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_hf_model_dir)
    assert (local.n_layers, local.d_model) == (2, 32)
    # The HF model ties its unembedding; TransformerLens loads it untied, as counted here.
    tied = sum(p.numel() for p in hf.parameters())
    assert local.n_params == tied + hf.config.vocab_size * hf.config.n_embd + hf.config.vocab_size


def test_qwen_capture_needs_more_than_embedded():
    qwen = _real("Qwen/Qwen2.5-0.5B", 24)
    for rule in ("capture", "train_sae", "baseline"):
        assert resources.mem_mb(qwen, rule) > resources.mem_mb(EMBEDDED, rule)
        assert resources.runtime(qwen, rule) >= resources.runtime(EMBEDDED, rule)


def test_retries_get_more_memory_and_walltime_within_the_cap():
    for rule in ("train_sae", "capture", "prompts"):
        assert resources.mem_mb(EMBEDDED, rule, 2) == 2 * resources.mem_mb(EMBEDDED, rule, 1)
        assert resources.runtime(EMBEDDED, rule, 2) > resources.runtime(EMBEDDED, rule, 1)
    big = _real("gpt2", 12)
    big["sae"] = {**big["sae"], "total_tokens": 10**10}
    assert resources.runtime(big, "train_sae", 3, cap=720) == 720


def test_gpus_and_cpus():
    assert resources.gpus(EMBEDDED, "train_sae") == 1
    assert resources.gpus(EMBEDDED, "prompts") == 0
    assert resources.gpus({**EMBEDDED, "device": "cpu"}, "train_sae") == 0
    gpt2 = _real("gpt2", 12)
    for rule in resources.BASE_RUNTIME:
        n = resources.threads(gpt2, rule)
        assert 1 <= n <= resources.MAX_CPUS_PER_GPU * max(1, resources.gpus(gpt2, rule))
