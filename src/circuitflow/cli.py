"""Shared start-up for the stage scripts: argument parsing, logging, and one-line errors with a
meaningful exit.

Arguments: `parser(__doc__)` (and `subcommands(parser)`) make the parser; `add_inputs(p, ...)`
adds the arguments several stages share (`--config`, `--behaviour`, `--prompts`,
`--model-json`, `--saes`, `--attribution-dir`), each with one spelling and help text;
`add_outputs(p, ...)` adds required `--out-NAME` paths; `parse(p)` returns the arguments and the
config loaded from `--config` (None for a command without one).

Exit statuses (circuitflow.errors): 0 done; 2 bad config or input (the line names the key or
file); 3 out of memory even at batch size 1; 4 no space left on the device (outputs are written
atomically: free space and rerun to resume); 75 stopped by SIGTERM after a checkpoint (rerun to
resume); 1 anything else (a bug: the traceback is kept).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from circuitflow.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECKPOINTED,
    EXIT_NO_SPACE,
    EXIT_OUT_OF_MEMORY,
    ConfigError,
    InputError,
)
from circuitflow.resumable import Interrupted

# The arguments several stage scripts take: one spelling, requiredness and help text each.
SHARED_ARGUMENTS: dict[str, dict[str, Any]] = {
    "config": {"required": True, "help": "resolved config JSON or a config YAML"},
    "behaviour": {"required": True, "help": "behaviour name (a key of behaviours)"},
    "prompts": {"required": True, "help": "prompts parquet"},
    "model-json": {"required": True, "help": "the model stage's model.json"},
    "saes": {"nargs": "*", "default": [], "help": "SAE directories (SAELens format)"},
    "attribution-dir": {"required": True, "help": "attribution/{behaviour}"},
}


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's parser; its module docstring is the description `--help` prints."""
    return argparse.ArgumentParser(description=doc)


def subcommands(p: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """Required subcommands, chosen one as `args.command`."""
    return p.add_subparsers(dest="command", required=True)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the option it fails)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def add_inputs(p: argparse.ArgumentParser, *names: str, **helps: str) -> None:
    """The shared arguments `names` (keys of SHARED_ARGUMENTS), in that order; `helps` replaces
    a help text where a command means something narrower (`model_json=...` for --model-json)."""
    for name in names:
        spec = dict(SHARED_ARGUMENTS[name])
        spec["help"] = helps.get(name.replace("-", "_"), spec["help"])
        p.add_argument(f"--{name}", **spec)


def add_outputs(p: argparse.ArgumentParser, *names: str, **helps: str) -> None:
    """Required output paths `--out-NAME`, in order; `helps` gives a help text by NAME."""
    for name in names:
        p.add_argument(f"--out-{name}", required=True, help=helps.get(name.replace("-", "_")))


def parse(p: argparse.ArgumentParser) -> tuple[argparse.Namespace, dict | None]:
    """The command line's arguments, and the config its `--config` names, loaded and checked
    (None when the command takes no --config). Call it inside `main`, so a bad config is one
    line and exit status 2."""
    args = p.parse_args()
    if getattr(args, "config", None) is None:
        return args, None
    from circuitflow import config as cf_config  # imports torch: only for commands that need it

    return args, cf_config.load(args.config)


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
