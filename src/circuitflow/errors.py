"""The errors a stage reports in one line and the exit status each one means.

Every stage script runs under `circuitflow.cli.main`, which turns these into one line on stderr
and a non-zero exit; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key."""


class InputError(ValueError):
    """An input file a stage cannot use (missing, incomplete, corrupt); the message names it."""


class ActivationFileError(InputError):
    """An activation file no stage may consume (incomplete, malformed)."""


class CheckpointError(InputError):
    """A checkpoint that exists but cannot be trusted."""


# Exit statuses of the stage scripts (cli.main), one meaning each.
EXIT_BAD_INPUT = 2  # ConfigError, InputError, a missing file
EXIT_OUT_OF_MEMORY = 3  # not even one item fits the device
EXIT_NO_SPACE = 4  # the disk filled up: free space, rerun to resume (outputs are atomic)
EXIT_CHECKPOINTED = 75  # SIGTERM: progress saved, a rerun resumes (EX_TEMPFAIL, sysexits.h)
