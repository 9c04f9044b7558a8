"""docs/csd3.md's walltime table, from dry runs of the ready configs on the CSD3 profile."""

from __future__ import annotations

import os
import re
import subprocess
from collections import defaultdict

from circuitflow.resources import PER_GROUP_RULES
from helpers.dag import REPO, SNAKEMAKE

CONFIGS = (
    "gpt2-small", "qwen2.5-0.5b", "gpt2-small-res-jb", "qwen3-0.6b-transcoders",
    "gemma-3-270m-transcoders",
)  # fmt: skip
RULE = re.compile(r"^\s*(?:local)?rule (\S+):")
RUNTIME = re.compile(r"\bruntime=(\d+)")
# One row per rule, whatever its wildcards or group (train_sae_stream_resid_post_layer_0_to_11).
FAMILY = re.compile(rf"^({'|'.join(sorted(PER_GROUP_RULES))})_.*")


def dry_run_walltimes(name: str) -> dict[str, list[int]]:
    """Each rule's first-attempt walltimes (minutes), one per job, as Snakemake's dry run of
    config/<name>.yaml on profiles/csd3 prints them."""
    env = {**os.environ, "CSD3_ACCOUNT": "DOCTEST-SL2", "HF_HUB_OFFLINE": "1"}
    cmd = [*SNAKEMAKE, "-n", "--profile", "profiles/csd3", "--configfile", f"config/{name}.yaml"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out: dict[str, list[int]] = defaultdict(list)
    rule = None
    for line in done.stdout.splitlines():
        if m := RULE.match(line):
            rule = FAMILY.sub(r"\1_{group}", m.group(1))
        elif rule and "resources:" in line and (m := RUNTIME.search(line)):
            out[rule].append(int(m.group(1)))
            rule = None
    return dict(out)


def span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    jobs = f" ({len(values)} jobs)" if len(values) > 1 else ""
    return (f"{lo}" if lo == hi else f"{lo}-{hi}") + jobs


def walltime_table() -> str:
    """The Markdown table of first-attempt walltimes (minutes) by rule and ready config."""
    runs = {name: dry_run_walltimes(name) for name in CONFIGS}
    rules = sorted({rule for run in runs.values() for rule in run} - {"all"})
    lines = ["| rule | " + " | ".join(f"`{n}`" for n in CONFIGS) + " |",
             "| --- |" + " ---: |" * len(CONFIGS)]  # fmt: skip
    for rule in rules:
        cells = [span(runs[n][rule]) if rule in runs[n] else "" for n in CONFIGS]
        lines.append(f"| `{rule}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
