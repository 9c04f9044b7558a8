"""The report's job costs: benchmark files joined with the stages' counted cost."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from circuitflow.report import job_costs as jc

TSV = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def bench(root, rel, seconds):
    path = root / "benchmarks" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TSV + f"{seconds}\t0:00:01\t700\t900\t650\t660\t1\t2\t90\t{seconds}\n")


def summary(root, rel, per, unit="prompt"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    cost = {"forward_equivalents_per_prompt": per, "forward_equivalents_unit": unit}
    path.write_text(json.dumps({"site": "resid_post", "layer": 0, "device": "cpu"} | cost))


def test_costs_per_stage_from_their_summaries(tmp_path):
    for rel in ("baseline/ioi.tsv", "capture.tsv", "train_sae/resid_post_layer_0.tsv",
                "attribution/ioi.tsv", "interventions/ioi.tsv", "prompts/ioi.tsv",
                "features/layers_0_to_1.tsv"):  # fmt: skip
        bench(tmp_path, rel, 3.0)
    summary(tmp_path, "baseline/ioi.json", 2.0)
    summary(tmp_path, "saes/resid_post/layer_0/metrics.json", 3.0, "evaluation context")
    summary(tmp_path, "attribution/ioi/summary.json", 40.0)
    summary(tmp_path, "interventions/ioi/summary.json", 90.0)
    (tmp_path / "activations/resid_post").mkdir(parents=True)
    with h5py.File(tmp_path / "activations/resid_post/layer_0.h5", "w") as f:
        f["acts"] = np.zeros((2, 2))
        f.attrs["forward_equivalents_per_prompt"] = 0.5
        f.attrs["forward_equivalents_unit"] = "context"
    # A features job of two dictionaries: the sum of their shares; another job's is not counted.
    for (site, layer), per, job in (
        (("resid_post", 0), 1.25, ["resid_post:0", "resid_post:1"]),
        (("resid_post", 1), 0.5, ["resid_post:0", "resid_post:1"]),
        (("resid_post", 2), 7.0, ["resid_post:2"]),
    ):
        path = tmp_path / "features" / site / f"layer_{layer}" / "summary.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"job_members": job, "forward_equivalents_per_prompt": per,
                                    "forward_equivalents_unit": "context"}))  # fmt: skip
    config = {"sites": ["resid_post"], "device": "cpu"}
    frame = jc.job_costs(tmp_path, config, ["ioi"], gpu_seen=False).set_index("rule")
    want = {"baseline": (2.0, "prompt"), "capture": (0.5, "context"),
            "train_sae": (3.0, "evaluation context"), "attribution": (40.0, "prompt"),
            "interventions": (90.0, "prompt"), "features": (1.75, "context")}  # fmt: skip
    for rule, (per, unit) in want.items():
        assert frame.loc[rule, "forward_equivalents_per_prompt"] == pytest.approx(per), rule
        assert frame.loc[rule, "forward_equivalents_unit"] == unit, rule
    assert np.isnan(frame.loc["prompts", "forward_equivalents_per_prompt"])
    rules = jc.per_rule(frame.reset_index()).set_index("rule")
    assert rules.loc["attribution", "forward_equivalents_per_prompt"] == pytest.approx(40.0)
    assert rules.loc["capture", "forward_equivalents_unit"] == "context"
