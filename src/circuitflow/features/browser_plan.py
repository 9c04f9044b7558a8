"""The feature browser's plan (rule report_features, report/features_page.py): one page of every
dictionary's features, whose memory grows with the features on it.

The page is built a dictionary at a time, each turned into JSON text before the next (its
Python objects take about 14 times the text's memory). Measured on the embedded default (512
features a dictionary, about 29 kept contexts each): peaks of 390 MiB for 1 dictionary and 421
MiB for 4, 312 MiB of them the report's runtime (memory.RUNTIME_MB): 20 kB a feature of text
(the dictionaries' JSON and the page's copies of it), 24 kB a feature of the dictionary being
built, over a fixed 56 MiB (Parquet and the page's template)."""

from __future__ import annotations

from circuitflow.description import describe

FIXED_BYTES = 56 * 2**20
TEXT_BYTES_PER_FEATURE = 20_000
BUILD_BYTES_PER_FEATURE = 24_000


def job_bytes(config: dict, rule: str, device: str) -> int:
    """Host bytes of the page's build beyond the report's runtime: every feature's text and the
    widest dictionary being built."""
    widths = [d.width for d in describe(config).dictionaries]
    return (
        FIXED_BYTES
        + sum(widths) * TEXT_BYTES_PER_FEATURE
        + max(widths, default=0) * BUILD_BYTES_PER_FEATURE
    )


def job_work(config: dict, rule: str, behaviour: str | None = None) -> None:
    """No counted work: a page (its walltime is the light class's)."""
    return None
