"""Shared start-up for the stage scripts: logging, and one-line errors with a meaningful exit.

Exit statuses (circuitflow.errors): 0 done; 2 bad config or input (the line names the key or
file); 3 out of memory even at batch size 1; 4 no space left on the device (outputs are written
atomically: free space and rerun to resume); 75 stopped by SIGTERM after a checkpoint (rerun to
resume); 1 anything else (a bug: the traceback is kept).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable

from circuitflow.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECKPOINTED,
    EXIT_NO_SPACE,
    EXIT_OUT_OF_MEMORY,
    ConfigError,
    InputError,
)
from circuitflow.resumable import Interrupted


def main(run: Callable[[], None]) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    try:
        run()
        _log_peak_memory()
    except (ConfigError, InputError, FileNotFoundError, ValueError) as err:
        _fail(f"error: {err}", EXIT_BAD_INPUT)
    except (OSError, RuntimeError) as err:  # h5py reports a failed write as RuntimeError
        if not disk_full(err):
            raise
        where = f" writing {err.filename}" if getattr(err, "filename", None) else ""
        why = getattr(err, "strerror", None)
        why = f" ({why})" if why and why != os.strerror(errno.ENOSPC) else ""
        _fail(
            f"error: no space left on device{where}{why}; free space (or move outdir), then "
            "rerun the same command: finished outputs are kept and capture and SAE training "
            "resume",
            EXIT_NO_SPACE,
        )
    except MemoryError as err:
        _fail(f"error: {err}", EXIT_OUT_OF_MEMORY)
    except Interrupted as err:
        _fail(f"{err}; rerun to resume", EXIT_CHECKPOINTED)


def disk_full(err: BaseException) -> bool:
    """ENOSPC, as the OS raises it or as h5py and safetensors report it (in the message only)."""
    while err is not None:
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _fail(message: str, status: int) -> None:
    print(" ".join(message.split()), file=sys.stderr)  # one line, whatever the message holds
    sys.exit(status)


def _log_peak_memory() -> None:
    """The job's exact peak resident set (Snakemake's benchmark files sample it, every 30 s after
    the first 15, and can miss a short peak): tests/test_memory_accuracy.py reads it."""
    from circuitflow.memory import MiB, resident_peak_bytes

    peak = resident_peak_bytes() / MiB
    logging.getLogger("circuitflow").info("peak resident memory: %.1f MiB", peak)
