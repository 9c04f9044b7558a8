#!/usr/bin/env python
"""What `make bench-gpu` needs on a GPU machine without network (a lent H200: CPython 3.12,
torch 2.11 and about 200 packages, none of circuitflow's own stack), carried there as wheels.

    python benchmarks/device_wheels.py fetch        # here, with network: .whl/ (git-ignored)
    python benchmarks/device_wheels.py install --target /tmp/circuitflow-site   # there
    python benchmarks/device_wheels.py check        # there: requirements met, the stages import
    python benchmarks/device_wheels.py online       # exit 0 where PyPI answers

`make bench-gpu` runs install, check and benchmarks/measure.py where .whl/ exists and PyPI does
not answer; the one device call is in docs/csd3.md ("Measuring on a lent GPU machine").

fetch follows the requirements of circuitflow (pyproject.toml) and of the benchmarks' extras
(EXTRAS: sparsify for sae_train.py) through the distributions installed in this environment,
at their versions (the stack the tests passed on), stopping at the packages the machine's image
holds (benchmarks/device_image.txt), and downloads each of the rest as a wheel for CPython 3.12
on manylinux x86_64 (`pip download --no-deps`; a package published only as a source archive
is built into a wheel here: all such are pure Python). Two wheels are trimmed of binaries
nothing here runs, to stay well under the 64 MiB a device call carries: pulp's CBC solvers
(Snakemake's ILP scheduler; benchmarks/scale.py asks for the greedy one) and wandb's service
programs (started by wandb.init, which nothing calls; SAELens imports wandb). It also packs the
code before issue 46 (`src-<ref>.tar`, a `git archive`), which benchmarks/trees.py reads where
git is missing. Each carried wheel's own requirements are then checked against the carried
set and the image, by name and, where the version is known, by version.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
IMAGE = Path(__file__).with_name("device_image.txt")
# sae_train.py's sparsify (installed in the benchmark's environment only): pinned here, as
# this environment does not hold it.
EXTRAS = {"eai-sparsify": "1.3.3", "natsort": "8.4.0", "schedulefree": "1.4.1"}
# Carried although the image holds them: snakemake 9 needs packaging < 26, and the image's
# version is not known (a Python 3.12 environment made from PyPI today gets 26.4).
OVER_IMAGE = ("packaging",)
# The code the "today" figures are of (benchmarks/measure.py's BEFORE_ISSUE_46).
BASELINE_REF = "eeb35b1"
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip
# Files left out of a wheel (by its distribution): binaries nothing here runs (see above).
TRIM = {"pulp": ("pulp/solverdir/cbc/",), "wandb": ("wandb/bin/",)}
LIMIT_MIB = 48  # of the 64 MiB a call carries; the working tree takes about 3
# What the benchmarks import on the device: every stage's module and the libraries.
IMPORTS = (
    "circuitflow.capture.stage", "circuitflow.sae.stage", "circuitflow.sae.stream_stage",
    "circuitflow.sae.pretrained_stage", "circuitflow.features.stage", "circuitflow.baseline",
    "circuitflow.attribution.stage", "circuitflow.attribution.prompt_graphs.stage",
    "circuitflow.interventions.stage", "circuitflow.report.gpu_hours", "circuitflow.resources",
    "sae_lens", "transformer_lens", "snakemake", "snakemake.cli", "h5py", "pandas", "pyarrow",
    "jsonschema", "yaml", "sparsify",
)  # fmt: skip


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image() -> dict[str, str | None]:
    """The image's packages: normalised name -> version where known."""
    out: dict[str, str | None] = {}
    for line in IMAGE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[norm(name)] = version or None
    return out


def roots() -> list[str]:
    """circuitflow's requirements (pyproject.toml), as requirement strings."""
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def requirements(dist: md.Distribution) -> list:
    """A distribution's requirements that apply here (extras left out)."""
    from packaging.requirements import Requirement

    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": "", "python_version": PYTHON}):
            out.append(req)
    return out


def closure() -> dict[str, str]:
    """Name -> installed version of every distribution circuitflow needs that the image lacks,
    followed through this environment's metadata (the image's own requirements are its own)."""
    from packaging.requirements import Requirement

    have = {k: v for k, v in image().items() if k not in OVER_IMAGE}
    found: dict[str, str] = {}
    todo = [Requirement(r).name for r in roots()] + list(OVER_IMAGE)
    while todo:
        name = todo.pop()
        key = norm(name)
        if key in found or key in have:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            sys.exit(f"{name}: needed by circuitflow but not installed here: run make install")
        found[key] = dist.version
        todo += [r.name for r in requirements(dist)]
    return found


def download(name: str, version: str, into: Path) -> None:
    """The wheel of `name==version` for the device into `into`; built here when PyPI has only
    its source archive."""
    spec = f"{name}=={version}"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", PYTHON, "--implementation", "cp", "-d", str(into), spec]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
        return
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-binary", name, "-w", str(into), spec],
                           capture_output=True, text=True)  # fmt: skip
    if built.returncode != 0:
        sys.exit(f"{spec}: no wheel for CPython {PYTHON} manylinux x86_64 and none built:\n"
                 f"{built.stderr[-2000:]}")  # fmt: skip
    wheel = next(into.glob(f"{re.sub(r'[-.]', '_', name)}-{version}-*.whl"), None)
    if wheel is None or not wheel.name.endswith("-py3-none-any.whl"):
        sys.exit(f"{spec}: built {wheel and wheel.name}, not a pure-Python wheel")


def trim(wheel: Path, prefixes: tuple[str, ...]) -> int:
    """Rewrite `wheel` without the files under `prefixes` (and their RECORD lines): bytes
    saved."""
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename.startswith(prefixes):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(x for x in lines if not x.startswith(prefixes)).encode()
            dst.writestr(item, data)
    os.replace(tmp, wheel)
    return before - wheel.stat().st_size


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    fields = [line.split(": ", 1) for line in text.splitlines() if ": " in line]
    get = {k: v for k, v in reversed(fields)}
    return get["Name"], get["Version"], [v for k, v in fields if k == "Requires-Dist"]


def unmet(folder: Path) -> list[str]:
    """Requirements of the wheels in `folder` that neither they nor the image meet (by name;
    by version where the image's is known)."""
    from packaging.requirements import Requirement

    carried = {}
    needs = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version, reqs = wheel_metadata(wheel)
        carried[norm(name)] = version
        needs += [(name, r) for r in reqs]
    have = image()
    problems = []
    for who, text in needs:
        req = Requirement(text)
        env = {"extra": "", "python_version": PYTHON, "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64"}  # fmt: skip
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        key = norm(req.name)
        version = carried.get(key) or have.get(key)
        if key not in carried and key not in have:
            problems.append(f"{who} needs {text}: neither carried nor in the image")
        elif version and req.specifier and not req.specifier.contains(version, prereleases=True):
            problems.append(f"{who} needs {text}: {version} there")
    return problems


def fetch(args) -> int:
    """.whl/: the wheels, trimmed, and the baseline tree (see the module's doc)."""
    wanted = closure() | {norm(k): v for k, v in EXTRAS.items()}
    if WHEELS.exists():
        shutil.rmtree(WHEELS)
    with tempfile.TemporaryDirectory(dir=REPO) as tmp:
        into = Path(tmp)
        for name, version in sorted(wanted.items()):
            download(name, version, into)
            print(f"  {name}=={version}", flush=True)
        for wheel in into.glob("*.whl"):
            name = norm(wheel.name.split("-")[0])
            if name in TRIM:
                saved = trim(wheel, TRIM[name])
                print(f"  {wheel.name}: {saved / 2**20:.1f} MiB of binaries left out")
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline_ref, "src",
                                  "workflow"], capture_output=True, check=True).stdout  # fmt: skip
        (into / f"src-{args.baseline_ref}.tar").write_bytes(archive)
        os.replace(into, WHEELS)
        into.mkdir()  # for TemporaryDirectory's clean-up
    size = sum(p.stat().st_size for p in WHEELS.iterdir())
    print(f"{WHEELS}: {len(wanted)} wheels and src-{args.baseline_ref}.tar, "
          f"{size / 2**20:.1f} MiB")  # fmt: skip
    problems = unmet(WHEELS)
    for p in problems:
        print(f"  unmet: {p}")
    if size > LIMIT_MIB * 2**20:
        print(f"over {LIMIT_MIB} MiB: a device call carries 64 MiB in all")
        return 1
    return 1 if problems else 0


def install(args) -> int:
    """The wheels into `--target`, without an index or their requirements (all carried)."""
    wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
    if not wheels:
        sys.exit(f"{WHEELS}: no wheels (run `python benchmarks/device_wheels.py fetch` where "
                 "PyPI answers)")  # fmt: skip
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(args.target),
           *wheels]  # fmt: skip
    return subprocess.run(cmd).returncode


def check(args) -> int:
    """Every requirement of circuitflow met by what this Python finds (installed versions
    against the specifiers, followed through their own requirements), and the modules the
    benchmarks run imported. Exit 1, naming each, where one is not."""
    from packaging.requirements import Requirement

    sys.path.insert(0, str(REPO / "src"))
    problems, seen = [], set()
    todo = [(Requirement(r), "circuitflow") for r in roots()]
    todo += [(Requirement(f"{k}=={v}"), "benchmarks") for k, v in EXTRAS.items()]
    while todo:
        req, who = todo.pop()
        key = norm(req.name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{req.name}: needed by {who} ({req}), not installed")
            continue
        if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
            problems.append(f"{req.name} {dist.version}: {who} needs {req}")
        if key not in seen:
            seen.add(key)
            todo += [(r, req.name) for r in requirements(dist)]
    for module in IMPORTS:
        try:
            importlib.import_module(module)
        except Exception as err:  # any failure to import is what this check reports
            problems.append(f"import {module}: {type(err).__name__}: {err}")
    versions = {n: md.version(n) for n in ("torch", "transformers", "sae-lens",
                                           "transformer-lens", "snakemake")}  # fmt: skip
    print("check: " + ", ".join(f"{k} {v}" for k, v in versions.items())
          + f"; {len(seen)} distributions, {len(IMPORTS)} modules")  # fmt: skip
    for p in problems:
        print(f"  {p}")
    return 1 if problems else 0


def online(args) -> int:
    """0 where PyPI answers (a package index to make the venv from), else 1."""
    import threading

    answered = threading.Event()

    def connect() -> None:
        try:
            socket.create_connection(("pypi.org", 443), timeout=3).close()
            answered.set()
        except OSError:
            pass

    # In a thread: the name look-up is not bounded by the socket's timeout, and a machine
    # without network may let it hang.
    threading.Thread(target=connect, daemon=True).start()
    return 0 if answered.wait(timeout=5) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download the wheels into .whl/ (needs network)")
    f.add_argument("--baseline-ref", default=BASELINE_REF, help="the code to pack beside")
    i = sub.add_parser("install", help="install .whl/ into a folder, offline")
    i.add_argument("--target", type=Path, required=True)
    sub.add_parser("check", help="requirements met, the benchmarks' modules import")
    sub.add_parser("online", help="exit 0 where PyPI answers")
    args = ap.parse_args()
    return {"fetch": fetch, "install": install, "check": check, "online": online}[args.command](
        args
    )


if __name__ == "__main__":
    sys.exit(main())
