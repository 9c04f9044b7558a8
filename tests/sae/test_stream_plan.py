"""The streaming SAE jobs' plan (sae.source: stream): the token set that holds the streamed budget,
which sites and layers share a job, and each job's memory and walltime."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml
from helpers.dag import REPO

from circuitflow import config as cf_config
from circuitflow import resources, stream_groups
from circuitflow.capture import plan as capture_plan
from circuitflow.capture import tokens as corpus
from circuitflow.capture.config import CaptureConfig
from circuitflow.cluster import Cluster
from circuitflow.description import describe
from circuitflow.errors import ConfigError
from circuitflow.sae import stream_plan
from circuitflow.sae.stream_plan import StreamGroup

EMBEDDED = cf_config.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
GPT2 = cf_config.load(REPO / "config" / "gpt2-small.yaml")
QWEN = cf_config.load(REPO / "config" / "qwen2.5-0.5b.yaml")


def _with(config: dict, **sae) -> dict:
    out = copy.deepcopy(config)
    stream = sae.pop("stream", {})
    out["sae"] |= sae
    out["sae"]["stream"] |= stream
    return out


# --- the token set --------------------------------------------------------------------------------
@pytest.fixture
def local_model(tiny_hf_model_dir, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    info = {"kind": "local_hf", "path": str(tiny_hf_model_dir), "architecture": {"n_ctx": 64},
            "weights_sha256": "abc"}  # fmt: skip
    (model_dir / "model.json").write_text(json.dumps(info))
    return model_dir


def test_the_token_set_holds_the_streamed_budget_and_the_held_out_contexts(local_model, tmp_path):
    """sae.source stream: `sae.total_tokens` training rows of distinct tokens (whole contexts)
    and `sae.eval_contexts` contexts more, which the SAEs are evaluated on and never train on;
    capture.n_tokens plays no part."""
    path = tmp_path / "corpus.txt"
    path.write_text(
        "".join(f"The capital of France is the city of Paris {i}\n" for i in range(400))
    )
    capture = CaptureConfig(n_tokens=150, context_length=16, corpus=str(path))
    stream = {"source": "stream", "total_tokens": 600, "eval_contexts": 4}
    toks, meta = corpus.build_token_set(capture, 0, local_model, stream)
    assert toks.shape == (40 + 4, 16) and meta["held_out_contexts"] == 4
    plain, plain_meta = corpus.build_token_set(capture, 0, local_model)
    assert plain.shape == (10, 16) and "held_out_contexts" not in plain_meta
    np.testing.assert_array_equal(toks[:10], plain)  # the same corpus, packed the same way
    # Every training row is its own token of the corpus: no context repeats.
    assert len({row.tobytes() for row in toks}) == len(toks)
    # The run's description holds that count, and capture's plans (capture_tokens's job, the
    # disk) read it there.
    cfg = _with(EMBEDDED, source="stream", total_tokens=600, eval_contexts=4)
    cfg["capture"] |= {"context_length": 16}
    run = describe(cfg)
    assert run.token_set_contexts == len(toks) and run.context_length == toks.shape[1]
    assert capture_plan.token_set_contexts(cfg) == len(toks)
    work = capture_plan.job_work(cfg, "capture_tokens")
    assert work.other_seconds == toks.size / capture_plan.TOKENIZE_TOKENS_PER_S
    assert capture_plan.job_bytes(cfg, "capture_tokens", "cpu") == 2 * 8 * toks.size
    assert capture_plan.disk_bytes(cfg) == 4 * 2 * toks.size


def test_a_corpus_too_small_for_the_streamed_budget_is_one_line(local_model, tmp_path):
    path = tmp_path / "small.txt"
    path.write_text("The capital of France is Paris\n" * 20)
    capture = CaptureConfig(n_tokens=150, context_length=16, corpus=str(path))
    stream = {"source": "stream", "total_tokens": 6000, "eval_contexts": 4}
    with pytest.raises(ValueError) as err:
        corpus.build_token_set(capture, 0, local_model, stream)
    message = str(err.value)
    held = int(message.split(" holds ")[1].split(" tokens")[0].replace(",", ""))
    assert "\n" not in message and message.startswith("sae.total_tokens: corpus ")
    assert 0 < held < 6000 and f"{path}" in message
    assert "6,000 training tokens and 4 evaluation contexts asks for 6,060" in message, message


# --- groups ---------------------------------------------------------------------------------------
def test_the_embedded_model_streams_one_layer_a_job():
    cfg = _with(EMBEDDED, source="stream", kind="sae")  # its SAEs alone
    groups = stream_groups.stream_groups(cfg)
    assert [g.members for g in groups] == [(("resid_post", 0),), (("resid_post", 1),)]
    assert [g.name for g in groups] == ["resid_post_layer_0", "resid_post_layer_1"]
    assert [g.depth for g in groups] == [1, 2]
    two = _with(cfg, stream={"layers_per_job": 2})
    (group,) = stream_groups.stream_groups(two)
    assert group.name == "resid_post_layer_0_to_1" and group.key == "resid_post:0,resid_post:1"
    assert StreamGroup.parse(group.key) == group


def test_layers_per_job_splits_consecutive_layers_evenly():
    sites = _with(GPT2, stream={"layers_per_job": 5})
    sites["sites"] = ["resid_post", "mlp_out"]
    groups = stream_groups.stream_groups(sites)
    # 24 hooks by layer, both sites of a layer side by side, in 5 groups of 4 or 5.
    assert [len(g.members) for g in groups] == [5, 5, 5, 5, 4]
    assert groups[0].members[:2] == (("resid_post", 0), ("mlp_out", 0))
    assert groups[0].name == "resid_post_layer_0_to_resid_post_layer_2"
    assert [g.depth for g in groups] == [3, 5, 8, 10, 12]
    assert sum((g.members for g in groups), ()) == tuple(stream_plan.members(sites))


def test_auto_fits_the_gpu_and_the_walltime_cap():
    """On a GPU `auto` takes the most hooks whose job the memory plan fits in 80% of the
    profile's GPU type and, under a walltime cap, whose planned work fits it."""
    # Slurm profiles that send GPU jobs to a partition (run here, see the test below).
    a100 = Cluster(gpu_type="A100", gpu_partition="gpu")
    t4 = Cluster(gpu_type="T4", gpu_partition="gpu")
    assert len(stream_groups.stream_groups(GPT2, a100)) == 1  # 12 GPT-2 SAEs fit 80 GB
    (qwen,) = stream_groups.stream_groups(QWEN, a100)
    budget = 0.8 * 81920 * 2**20
    assert stream_plan.group_bytes(QWEN, qwen, "cuda") <= budget
    on_t4 = stream_groups.stream_groups(QWEN, t4)
    assert len(on_t4) > 1
    n = max(len(g.members) for g in on_t4)
    larger = StreamGroup(tuple(stream_plan.members(QWEN)[: n + 1]))
    assert stream_plan.group_bytes(QWEN, larger, "cuda") > 0.8 * 15360 * 2**20
    # CSD3's 36-hour cap: 24 Qwen SAEs of 300M tokens are too much work for one job there.
    capped = Cluster(gpu_type="A100", max_runtime=2160, gpu_partition="gpu")
    groups = stream_groups.stream_groups(QWEN, capped)
    assert len(groups) > 1
    for g in groups:
        minutes = resources.work_seconds(QWEN, "train_sae_stream", capped, g.key) / 60
        assert capped.startup_minutes + minutes <= 2160
    # Memory grows with the group: one Qwen layer's job needs far less than 24 layers' (with
    # the fast trainer's plan; `auto` plans what the newest GPU measurement picks).
    one, fast = StreamGroup((("resid_post", 23),)), _with(QWEN, trainer="fast")
    assert (
        stream_plan.group_bytes(fast, one, "cuda") < stream_plan.group_bytes(fast, qwen, "cuda") / 5
    )
    # No GPU, or pinned by the config: one a job, or the count asked for.
    assert len(stream_groups.stream_groups({**QWEN, "device": "cpu"}, a100)) == 24
    assert len(stream_groups.stream_groups(_with(QWEN, stream={"layers_per_job": 24}), t4)) == 1


def test_a_single_sae_too_large_for_the_gpu_is_a_config_error():
    huge = _with(QWEN, expansion_factor=2048)
    with pytest.raises(ConfigError, match=r"sae.stream.layers_per_job: one SAE's streaming job"):
        stream_groups.stream_groups(huge, Cluster(gpu_type="T4", gpu_partition="gpu"))


# --- resources ------------------------------------------------------------------------------------
def test_each_job_is_planned_from_its_group():
    """Walltime from the group's work: its SAEs' tokens and its forward passes through its
    deepest layer; memory (on the CPU, where the host holds it all) from its SAEs and buffers."""
    cfg = {**_with(GPT2, stream={"layers_per_job": 4}), "device": "cpu"}
    first, _, last = stream_groups.stream_groups(cfg)
    idle = Cluster(startup_minutes=0, resumable_max_runtime=10**6)
    w_first = resources.job_work(cfg, "train_sae_stream", first.key)
    w_last = resources.job_work(cfg, "train_sae_stream", last.key)
    sae = w_first.flops["float32"]
    assert w_last.flops["float32"] == pytest.approx(sae)  # 4 SAEs each, evaluations alike
    # The forward passes (in the model's 16-bit dtype on a GPU): 12 blocks deep against 4.
    assert w_last.flops["bfloat16"] == pytest.approx(3 * w_first.flops["bfloat16"])
    single = {**cfg, "sae": {**cfg["sae"], "stream": {**cfg["sae"]["stream"], "layers_per_job": 1}}}
    one = stream_groups.stream_groups(single)[0]
    assert resources.work_seconds(cfg, "train_sae_stream", idle, first.key) > 3.9 * (
        resources.work_seconds(single, "train_sae_stream", idle, one.key)
    )
    assert resources.mem_mb(cfg, "train_sae_stream", 1, first.key) > resources.mem_mb(
        cfg, "train_sae_stream", 1, one.key
    )
    # Retries grow both, as for every rule.
    assert resources.mem_mb(cfg, "train_sae_stream", 2, first.key) == 2 * resources.mem_mb(
        cfg, "train_sae_stream", 1, first.key
    )


def test_auto_is_one_layer_a_job_when_run_here_without_a_gpu(monkeypatch):
    """`device: auto` on a workstation profile (no GPU partition): the jobs run on this machine,
    so without a GPU here `auto` is one layer a job, as on the CPU; with one, it fits the GPU
    (issue 40: a laptop planned one A100-sized job)."""
    import torch

    here = Cluster(gpu_type="A100")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert len(stream_groups.stream_groups(GPT2, here)) == 12
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert len(stream_groups.stream_groups(GPT2, here)) == 1
