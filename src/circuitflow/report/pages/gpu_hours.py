"""The GPU-hours page: hours of a full run from the GPU suite's results (report/gpu_hours.py
estimates them), and those results."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from circuitflow.report import gpu_hours
from circuitflow.report.html import note, table_html

SUITE_COLUMNS = [
    "model", "stage", "variant", "tokens_per_s", "prompts_per_s", "batch_size", "dtype",
    "peak_memory_mb", "planned_memory_mb", "plan_ratio", "flops_per_token", "achieved_tflops",
    "roofline_share", "ratio_to_forward",
]  # fmt: skip


def suite_table(suite: dict) -> pd.DataFrame:
    """The GPU suite's records: rate, peak memory against the plan, roofline share."""
    frame = pd.DataFrame(suite["results"])
    for col in ("peak_memory_bytes", "planned_memory_bytes"):
        if col in frame:
            frame[col.replace("_bytes", "_mb")] = frame[col] / 2**20
    frame["achieved_tflops"] = frame["achieved_flops"] / 1e12
    return frame.reindex(columns=SUITE_COLUMNS)


def gpu_hours_sections(
    suite_paths: list[Path | str],
    run_config: dict,
    reference: dict,
    reference_name: str,
    gpu: str = "A100",
    cluster=None,
) -> list[tuple[str, str]]:
    """Per suite result file: hours on a `gpu` of this run (when the suite covers its model) and of
    the reference run (`reference`, the CSD3 Qwen2.5-0.5B config), then the suite's figures."""
    if not suite_paths:
        return [("No GPU suite results", note(
            "benchmarks/results/ holds no result of benchmarks/gpu_suite.py; run it on the GPU "
            "type you will use and commit the JSON it writes."))]  # fmt: skip
    sections = []
    for path in suite_paths:
        suite = gpu_hours.load_suite(path)  # checked: one line naming the file
        name = Path(path).name
        intro = note(html.escape(gpu_hours.describe(suite, gpu)) + ".")
        configs = [(f"this run ({run_config['model']['name']})", run_config)]
        configs.append((reference_name, reference))
        for label, cfg in configs:
            try:
                frame = gpu_hours.estimate(suite, cfg, gpu=gpu, cluster=cluster)
            except ValueError as err:
                body = note(html.escape(str(err)))
            else:
                body = table_html(frame)
            sections.append((f"{gpu}-hours of {label}, from {name}", intro + body))
        sections.append((f"GPU suite figures ({name})", intro + table_html(suite_table(suite))))
    return sections
