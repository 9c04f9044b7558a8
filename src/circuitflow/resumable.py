"""Jobs that checkpoint on SIGTERM and resume on rerun (Slurm sends SIGTERM before walltime).

A long loop polls `stop.requested` between units of work; when set, it saves its progress and
raises `Interrupted`, which `cli.main` turns into exit status 75 (EXIT_CHECKPOINTED): Snakemake
retries the job and the retry resumes from the checkpoint.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class Interrupted(Exception):
    """SIGTERM arrived; progress up to the last checkpoint is on disk and a rerun resumes."""


@dataclass
class StopFlag:
    requested: bool = False


@contextmanager
def sigterm_flag() -> Iterator[StopFlag]:
    """A flag set by SIGTERM for the duration of the block. Outside the main thread (where
    Python refuses signal handlers) the flag never sets and SIGTERM keeps its default."""
    flag = StopFlag()

    def handler(signum, frame):  # noqa: ARG001
        flag.requested = True

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)
