"""The GPU benchmark suite run on CPU at small sizes (no GPU needed), the GPU-hours estimate from
suite results, and the tables of docs/csd3.md checked against the code that computes them."""

from __future__ import annotations

import json
import re

import pytest
from helpers.dag import REPO, profile_cluster

from circuitflow.report import gpu_hours, presets

STORED = REPO / "benchmarks" / "results" / "cpu.json"
README = REPO / "docs" / "csd3.md"
QWEN = REPO / "config" / "qwen2.5-0.5b.yaml"
MODELS = ("gpt2-small", "qwen2.5-0.5b")
STAGES = {
    ("forward", "no hooks"),
    ("capture", "2 hooks"),
    ("sae_train", "topk-32x-k32"),
    ("sae_train", "default"),
    ("attribution", "atp, 2 SAEs"),
}


@pytest.fixture(scope="module")
def small(measure_cpu):
    """The suite at small sizes on the CPU (both models) and what it printed: the GPU-suite step
    of benchmarks/measure.py's CPU mode (conftest's measure_cpu, shared with
    tests/test_measure.py)."""
    out = measure_cpu / "results" / "gpu_suite-cpu-smoke.json"
    assert out.is_file(), (measure_cpu / "screen.txt").read_text()[-3000:]
    return json.loads(out.read_text()), (measure_cpu / "logs" / "gpu_suite.log").read_text()


def test_small_suite_covers_every_stage_and_model(small):
    result, stdout = small
    assert result["mode"] == "small" and result["device"]["type"] == "cpu"
    assert result["peak_flops"]["measured"]["float32"] > 0
    assert result["disk_write_bytes_per_s"] > 0
    seen = {(r["model"], r["stage"], r["variant"]) for r in result["results"]}
    assert seen == {(m, s, v) for m in MODELS for s, v in STAGES}
    for r in result["results"]:
        rate = r["prompts_per_s"] if r["stage"] == "attribution" else r["tokens_per_s"]
        assert rate > 0, r
        assert r["flops_per_token"] > 0 and r["device_peak_flops"] > 0
        assert r["achieved_flops"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"])
        assert 0 < r["roofline_share"] <= 1, r
        assert r["peak_source"] == "measured"  # a CPU has no datasheet entry
        if r["stage"] != "forward":
            assert r["peak_memory_bytes"] > 0 and r["planned_memory_bytes"] > 0
            assert r["plan_ratio"] == pytest.approx(
                r["planned_memory_bytes"] / r["peak_memory_bytes"]
            )
        if r["stage"] in ("capture", "attribution"):
            assert r["ratio_to_forward"] > 0
    # After the final peak measurement, one printed line per record with its roofline share.
    final = stdout.split("final figures")[1]
    assert len(re.findall(r"roofline \d+\.\d%", final)) == len(result["results"])


def test_gpu_hours_from_a_suite_result(small):
    result, _ = small
    with pytest.raises(ValueError, match="--small"):
        gpu_hours.estimate(result, gpu_hours.load_config(QWEN))
    frame = gpu_hours.estimate(result, gpu_hours.load_config(QWEN), allow_small=True)
    # The ready config streams (sae.source: stream): no capture, one streaming job per group.
    assert list(frame["stage"]) == [
        "baseline",
        "train_sae_stream",
        "attribution",
        "interventions",
        "features",
        "total",
    ]
    assert (frame["gpu_hours"] > 0).all()
    assert frame["gpu_hours"].iloc[-1] == pytest.approx(frame["gpu_hours"].iloc[:-1].sum())
    by_stage = frame.set_index("stage")
    assert by_stage.loc["attribution", "jobs"] == 2
    # 24 layers' SAEs and their optimisers fit an A100 together: one job, one forward pass.
    assert by_stage.loc["train_sae_stream", "jobs"] == 1
    assert by_stage.loc["train_sae_stream", "work"] == 24 * 300_000_000
    assert "1.00 forward passes a token" in by_stage.loc["train_sae_stream", "source"]
    assert all("projected" in s or "disk bound" in s for s in frame["source"].iloc[:-1])
    # The same run by capture: the capture job and one train_sae job per layer.
    capture = gpu_hours.load_config(QWEN)
    capture["sae"]["source"] = "capture"
    stages = gpu_hours.estimate(result, capture, allow_small=True).set_index("stage")
    assert stages.loc["train_sae", "jobs"] == 24 and stages.loc["capture", "jobs"] == 1
    # Published dictionaries: nothing captured or trained, each one measured on the tokens, all
    # 24 in one job (grouped as streaming groups them: a short evaluation each).
    capture["sae"]["source"] = "pretrained"
    frame = gpu_hours.estimate(result, capture, allow_small=True)
    assert list(frame["stage"]) == [
        "baseline",
        "pretrained_sae",
        "attribution",
        "interventions",
        "features",
        "total",
    ]
    row = frame.set_index("stage").loc["pretrained_sae"]
    assert row["jobs"] == 1 and row["gpu_hours"] < by_stage.loc["train_sae_stream", "gpu_hours"]
    assert "1 job of 24 dictionaries," in row["source"]


def _readme_block(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- {name} -->\n(.*?)\n<!-- /{name} -->", text, re.S)
    assert match, f"docs/csd3.md has no <!-- {name} --> block"
    return match.group(1).strip()


def test_readme_presets_are_what_the_planner_computes():
    assert _readme_block("gpu-presets") == presets.presets_markdown()


def test_presets_shrink_with_the_gpu():
    rows = {(r["gpu"], r["model"]): r for r in presets.gpu_presets()}
    for model in MODELS:
        big, small_gpu = rows[("A100-80GB", model)], rows[("T4-16GB", model)]
        for stage in ("capture", "sae", "attribution"):
            assert small_gpu[stage] <= big[stage]
            assert big[stage] & (big[stage] - 1) == 0  # a power of two
            assert big[f"{stage}_gib"] <= 0.8 * (81920 - 1024) / 1024


def test_stored_cpu_result_gives_the_readme_gpu_hours():
    suite = gpu_hours.load_suite(STORED)
    assert suite["mode"] != "small" and suite["device"]["type"] == "cpu"
    frame = gpu_hours.estimate(suite, gpu_hours.load_config(QWEN), cluster=profile_cluster("csd3"))
    assert _readme_block("gpu-hours") == gpu_hours.markdown(frame)


H200_RESULT = REPO / "benchmarks" / "results" / "gpu_suite-nvidia-h200-cuda.json"


@pytest.mark.parametrize(("block", "gpu"), [("gpu-hours-h200", "H200"),
                                            ("gpu-hours-h200-a100", "A100")])  # fmt: skip
def test_stored_h200_result_gives_the_measured_gpu_hours(block, gpu):
    """docs/csd3.md's tables from the suite run on an H200 (benchmarks/measure.py): measured
    H200-hours, and the A100-hours projected from them."""
    suite = gpu_hours.load_suite(H200_RESULT)
    assert suite["mode"] == "full" and "H200" in suite["device"]["name"]
    assert gpu_hours.measured_on(suite, "H200") and not gpu_hours.measured_on(suite, "A100")
    csd3 = profile_cluster("csd3")
    frame = gpu_hours.estimate(suite, gpu_hours.load_config(QWEN), gpu=gpu, cluster=csd3)
    assert _readme_block(block) == gpu_hours.markdown(frame)
    # The streaming jobs as CSD3's dry run groups them (issue 40: not 1 job of 24 SAEs).
    if gpu == "A100":
        assert "3 jobs of 8 SAEs" in _readme_block(block)
