"""benchmarks/device_wheels.py's checks of the wheels a GPU machine without network gets: what
their requirements leave unmet, and the binaries left out of a wheel (its RECORD kept true)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import device_wheels  # noqa: E402


def wheel(folder: Path, name: str, version: str, requires: list[str], files=()) -> Path:
    """A minimal wheel: METADATA with Requires-Dist lines, RECORD naming every file."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    names = [*files, f"{info}/METADATA", f"{info}/RECORD"]
    with zipfile.ZipFile(path, "w") as z:
        for f in files:
            z.writestr(f, b"x" * 1000)
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in names))
    return path


def test_unmet_names_missing_and_wrong_versions(tmp_path, monkeypatch):
    image = tmp_path / "image.txt"
    image.write_text("# the image\ntorch==2.11.0\nnumpy\n")
    monkeypatch.setattr(device_wheels, "IMAGE", image)
    needs = ["beta>=2", "torch>=2.12", "numpy<3", "gamma; sys_platform == 'win32'",
             "delta; extra == 'x'"]  # fmt: skip
    wheel(tmp_path, "alpha", "1.0", needs)
    wheel(tmp_path, "beta", "2.1", ["epsilon"])
    problems = device_wheels.unmet(tmp_path)
    assert problems == [
        "alpha needs torch>=2.12: 2.11.0 there",
        "beta needs epsilon: neither carried nor in the image",
    ]


def test_trim_leaves_out_files_and_their_record_lines(tmp_path):
    path = wheel(tmp_path, "pulp", "3.3.2", [],
                 files=["pulp/__init__.py", "pulp/solverdir/cbc/linux/64/cbc"])  # fmt: skip
    saved = device_wheels.trim(path, ("pulp/solverdir/cbc/",))
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        record = z.read("pulp-3.3.2.dist-info/RECORD").decode()
    assert saved > 0
    assert "pulp/solverdir/cbc/linux/64/cbc" not in names and "pulp/__init__.py" in names
    assert "solverdir" not in record and "pulp/__init__.py" in record
