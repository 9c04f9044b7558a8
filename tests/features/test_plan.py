"""The features stage's plan: its memory does not grow with the tokens read (the streaming top-k
merge's bound, `collect.state_bytes` per dictionary), its groups share a layer's sites, and at
GPT-2-small scale (12 layers of 24,576-latent SAEs, 10M tokens) it fits an A100 with its work
counted from the model's shape."""

from __future__ import annotations

import copy

import pytest
import yaml
from helpers.dag import REPO

from circuitflow import config as cf_config
from circuitflow import resources
from circuitflow.features import plan
from circuitflow.features.collect import Collector, state_bytes
from circuitflow.memory import estimate_forward, model_dtype
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.perf import GPU_MEMORY_BYTES


def gpt2_small(n_tokens: int = 10_000_000) -> dict:
    config = cf_config.resolve(yaml.safe_load((REPO / "config" / "gpt2-small.yaml").read_text()))
    config["features"]["n_tokens"] = n_tokens
    return config


def test_state_bytes_are_the_collectors():
    c = Collector(300, k=7, samples=3)
    assert c.state_bytes() == state_bytes(300, 7, 3)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_memory_is_bounded_by_k_times_features_not_tokens(device):
    """Ten times the tokens: the same peak on the device (the token set's pages, fixed by the
    token set, are host memory); the collectors are k x features per dictionary."""
    config = gpt2_small()
    group = plan.group_of(config, None)
    few = plan.estimate(gpt2_small(1_000_000), group, device)
    many = plan.estimate(config, group, device)
    assert few == many
    assert config["sae"]["expansion_factor"] * 768 == 24_576 and len(group.members) == 12
    collectors = 12 * state_bytes(24_576, config["features"]["k"], config["features"]["samples"])
    assert collectors == 784_465_920  # 65.4 MB a dictionary
    fwd = estimate_forward(
        architectures.model_cfg(config), architectures.n_params(architectures.model_cfg(config)),
        128, 12, 12, model_dtype(config, device), "float32", device,
    )  # fmt: skip
    assert many.fixed_device == fwd.fixed_device + collectors


def test_gpt2_small_fits_an_a100_in_one_job():
    from helpers.dag import profile_cluster

    config = gpt2_small()
    cluster = profile_cluster("csd3")
    (group,) = plan.groups(config)
    est = plan.estimate(config, group, "cuda")
    assert est.total(plan.planned_batch(config)) < 0.8 * GPU_MEMORY_BYTES[cluster.gpu_type]
    # Counted work: the pass through 12 layers and every dictionary's encoder over 10M tokens.
    work = resources.job_work(config, "features", group.key)
    cfg = architectures.model_cfg(config)
    n_tokens = plan.wanted_contexts(config, cfg) * 128
    assert n_tokens >= 10_000_000
    assert work.flops["bfloat16"] >= n_tokens * forward_flops_per_token(cfg, 128, 12, False)
    assert work.flops["float32"] >= 12 * n_tokens * 2 * 768 * 24_576
    minutes = resources.runtime(config, "features", 1, cluster, group.key)
    assert minutes <= cluster.max_runtime


def test_groups_keep_a_layers_dictionaries_together():
    config = copy.deepcopy(gpt2_small())
    config["sae"]["kind"] = "both"
    config["features"]["layers_per_job"] = 5
    groups = plan.groups(config)
    assert [g.name for g in groups] == ["layers_0_to_4", "layers_5_to_9", "layers_10_to_11"]
    assert groups[0].members[:2] == (("resid_post", 0), ("mlp_out", 0))
    assert [plan.FeatureGroup.parse(g.key) for g in groups] == groups
    assert sum(len(g.members) for g in groups) == 24 and groups[-1].depth == 12
