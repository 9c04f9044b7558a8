"""Stage jobs forked from a warm interpreter: a development and test harness (issue 56).

A stage job that loads a model pays about 8 CPU-seconds of imports (torch, TransformerLens,
transformers, pandas) before it works, and on the small runs the test suite makes that is most
of the job. `serve` imports those libraries once and listens on a Unix socket; the workflow's
stage command (`stage()` in workflow/rules/common.smk, when CIRCUITFLOW_PREFORK names the
socket) then runs `python -m circuitflow.prefork SOCKET SCRIPT ARGS...`, a client that imports
nothing heavy: the server forks a child that takes the client's working directory, environment
and standard streams and runs the script as `python SCRIPT ARGS...` would, and the client exits
with the script's status. A signal the client can catch (SIGTERM, SIGINT, ...) is passed on to
the script; a client killed outright (SIGKILL) takes the script with it, with SIGKILL.
Where no server answers, the client becomes `python SCRIPT ARGS...` itself.

Not for runs whose benchmarks are read: Snakemake measures the client's process tree, so a
forked job's max_rss and cpu_time in results/benchmarks/ are the client's, not the work's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys

# What the stage scripts that load a model import before any work (measured with
# `python -X importtime`: TransformerLens ~5.6 s, torch ~1.9 s, pandas ~0.5 s on 2 cores).
PRELOAD = (
    "torch",
    "transformer_lens",
    "sae_lens",
    "pandas",
    "pyarrow.parquet",
    "h5py",
    "safetensors.torch",
    "matplotlib.pyplot",
    "tqdm",
)
ENV = "CIRCUITFLOW_PREFORK"
# What stage() gives every job that loads a model; the server's imports read it once (OpenMP's
# thread pool, the hub's offline flags), so the server must start with it too.
JOB_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_STATUS = struct.Struct("!i")


def start(path: str, **popen):
    """A server on `path` in its own process, with the jobs' environment (JOB_ENV, src/ on
    PYTHONPATH); `popen`: more subprocess.Popen arguments."""
    import subprocess

    env = {**os.environ, **JOB_ENV, "PYTHONPATH": SRC}
    return subprocess.Popen([sys.executable, "-m", "circuitflow.prefork", "serve", path],
                            env=env, stdin=subprocess.DEVNULL, **popen)  # fmt: skip


def wait_listening(server, path: str, timeout: float = 300) -> None:
    """Until `server` (from start) listens on `path`: it imports PRELOAD first."""
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if server.poll() is not None:
            raise RuntimeError(f"the prefork server exited ({server.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the prefork server did not listen on {path} in {timeout:.0f} s")
        time.sleep(0.2)


def serve(path: str) -> None:
    """Import PRELOAD, then fork a job per connection on Unix socket `path` until killed."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}.tmp"
    server.bind(tmp)
    server.listen(64)
    os.replace(tmp, path)  # clients see the socket only once it listens
    # Reap finished supervisors; SIG_IGN would be inherited and break the scripts' subprocess.
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    while True:
        try:
            conn, _ = server.accept()
        except InterruptedError:
            continue
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(_supervise(conn))
        conn.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _supervise(conn: socket.socket) -> int:
    """Run one job: read the request and the client's three streams, fork the script, and send
    its status back; kill it if the client goes away first."""
    try:
        head, fds, _, _ = socket.recv_fds(conn, _STATUS.size, 3)
        (size,) = _STATUS.unpack(head)
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                return 1
            body += chunk
        request = json.loads(body)
    except (OSError, ValueError, struct.error):
        return 1
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_script(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    poller = select.poll()
    poller.register(conn, select.POLLIN | select.POLLHUP)
    try:  # wakes when the job ends (Linux 5.3); else look every 0.2 s
        poller.register(os.pidfd_open(pid), select.POLLIN)
        timeout = None
    except (AttributeError, OSError):
        timeout = 200
    while True:
        ready = {fd for fd, _ in poller.poll(timeout)}
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(wait_status)
            code = status if status >= 0 else 128 - status
            try:
                conn.sendall(_STATUS.pack(code))
            except OSError:
                pass
            return 0
        if conn.fileno() in ready:
            try:
                signals = conn.recv(64)
            except OSError:
                signals = b""
            # A signal the client caught, passed on; or the client is gone (killed outright,
            # SIGKILL): so is the job, as a job in its process group would be.
            for number in signals or [signal.SIGKILL]:
                os.kill(pid, number)
            if not signals:
                os.waitpid(pid, 0)
                return 0


def _run_script(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python SCRIPT ARGS...` in the client's directory,
    environment and streams, run it, and exit with its status."""
    import atexit
    import runpy
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(1, entry)
    import torch

    # The job's threads, as OMP_NUM_THREADS gives a fresh interpreter.
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 1)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # h5py closes its files, logging flushes
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def client(path: str, argv: list[str]) -> int:
    """Run `python argv...` in the server at `path`, or here when none answers."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        os.execv(sys.executable, [sys.executable, *argv])
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    body = json.dumps(request).encode()
    socket.send_fds(conn, [_STATUS.pack(len(body))], [0, 1, 2])
    conn.sendall(body)
    # What Snakemake (or a user's Ctrl-C, or Slurm) sends the job goes on to the script, which
    # may checkpoint on it; the status still comes back.
    for number in FORWARDED:
        signal.signal(number, lambda n, _: conn.send(bytes([n])))
    reply = b""
    while len(reply) < _STATUS.size:
        chunk = conn.recv(_STATUS.size - len(reply))
        if not chunk:  # the server died with the job
            print(f"prefork: server at {path} ended before {argv[0]} did", file=sys.stderr)
            return 1
        reply += chunk
    return _STATUS.unpack(reply)[0]


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[1], sys.argv[2:]))
