"""Per-rule job resources (src/circuitflow/resources.py): GPUs, CPUs, memory, walltime."""

from __future__ import annotations

import copy

import yaml
from conftest import REPO

from circuitflow import config as cf_config
from circuitflow import resources

EMBEDDED = cf_config.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))


def _real(name: str, n_layers: int) -> dict:
    cfg = copy.deepcopy(EMBEDDED)
    cfg["model"] = {**cfg["model"], "name": name, "n_layers": n_layers}
    return cfg


def test_model_shape_from_architecture_and_table():
    assert resources.model_shape(EMBEDDED).d_model == 64
    qwen = resources.model_shape(_real("Qwen/Qwen2.5-0.5B", 24))
    assert 4e8 < qwen.n_params < 6e8  # 494M
    assert 1e8 < resources.model_shape(_real("gpt2", 12)).n_params < 1.7e8


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
