"""The feature browser's plan (rule report_features_dictionary, report/features_page.py): a
dictionary's page, whose memory grows with its features. (The index, report_features, reads
every dictionary's summary.json only: no plan.)

Measured on the embedded default (512 features a dictionary, about 29 kept contexts each) when
the browser was one page of every dictionary: peaks of 390 MiB for 1 dictionary and 421 MiB for
4, 312 MiB of them the report's runtime (memory.RUNTIME_MB): 20 kB a feature of text (the
dictionary's JSON and the page's copies of it), 24 kB a feature of the dictionary being built
(its Python objects), over a fixed 56 MiB (Parquet and the page's template). A page per
dictionary holds one dictionary's text and objects: at GPT-2 small's 24,576 latents, 1.06 GiB
beside the runtime a job (1,863 MB asked of Slurm), where the single page of its 12 dictionaries
planned 6.1 GiB (8.3 GB asked)."""

from __future__ import annotations

from circuitflow.description import describe
from circuitflow.nodes import dictionary_anchor

FIXED_BYTES = 56 * 2**20
TEXT_BYTES_PER_FEATURE = 20_000
BUILD_BYTES_PER_FEATURE = 24_000


def job_bytes(config: dict, rule: str, device: str, job: str | None = None) -> int:
    """Host bytes of a dictionary's page beyond the report's runtime: its features' text and
    objects. `job`: the dictionary's anchor (`resid_post.1`, the job's site and layer); None:
    the widest dictionary's (what the run's fit is checked against)."""
    widths = {dictionary_anchor(d.site, d.layer): d.width for d in describe(config).dictionaries}
    if job is not None and job not in widths:
        raise KeyError(f"feature browser: no dictionary {job!r} in this run")
    width = widths[job] if job is not None else max(widths.values(), default=0)
    return FIXED_BYTES + width * (TEXT_BYTES_PER_FEATURE + BUILD_BYTES_PER_FEATURE)


def job_work(config: dict, rule: str, behaviour: str | None = None) -> None:
    """No counted work: a page (its walltime is the light class's)."""
    return None
