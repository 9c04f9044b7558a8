"""Shared start-up for the stage scripts: logging, and one-line errors with a non-zero exit."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from circuitflow.config import ConfigError


def main(run: Callable[[], None]) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    try:
        run()
    except (ConfigError, FileNotFoundError, ValueError, MemoryError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
