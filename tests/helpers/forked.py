"""A function run in a forked copy of the test process, behind the part of Popen's interface the
kill-and-resume tests use (poll, send_signal, communicate, returncode).

The child is a process of its own, so a signal reaches it as Slurm's would, but it starts with
torch, TransformerLens and SAELens already imported: a fresh interpreter spends about 6 s of CPU
importing them, most of each of those tests. The child never returns into pytest: it leaves
through os._exit, its stderr in a file the parent reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

from circuitflow.errors import EXIT_CHECKPOINTED
from circuitflow.resumable import Interrupted


class Forked:
    def __init__(self, fn: Callable[[], object]):
        self._err = tempfile.TemporaryFile()
        self.returncode: int | None = None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            self._child(fn)

    def _child(self, fn: Callable[[], object]) -> None:
        code = 1
        try:
            os.dup2(self._err.fileno(), 2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - closed by os._exit
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)  # the code under test installs its own
            fn()
            code = 0
        except Interrupted as exc:  # a stage script's exit on SIGTERM (circuitflow.cli)
            print(exc, file=sys.stderr)
            code = EXIT_CHECKPOINTED
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the child (killing it after `timeout` s); ("", its stderr)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout)
            time.sleep(0.02)
        self._err.seek(0)
        return "", self._err.read().decode(errors="replace")
