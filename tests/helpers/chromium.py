"""Headless Chromium for the tests that look at pages as a reader would: Debian's chromium
(installed here when missing and the test runs as root with apt-get), a fresh profile per run."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1400,1000", "--virtual-time-budget=30000",
]  # fmt: skip


def chromium() -> str:
    """Debian's chromium, installed here if missing (CI runs as root with the registry)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium missing and cannot be installed (not root or no apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"chromium cannot be installed: {' '.join(cmd)}: {done.stderr[-300:]}")
    return shutil.which("chromium") or pytest.skip("chromium installed but not on PATH")


def browse(browser: str, page: Path, *args: str, fragment: str = "") -> subprocess.CompletedProcess:
    """Open `page` (a file) once with CHROMIUM_FLAGS and `args` (--dump-dom, --screenshot=...),
    at `#fragment` when given."""
    url = page.as_uri() + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=180,
        )
