"""Atomic writes: a failed write leaves the old file (or nothing), never a half-written one."""

from __future__ import annotations

import pytest

from circuitflow.io import atomic_dir, atomic_path, sha256_file, sha256_files, write_json


def test_failed_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text('{"v": 2, "trunc')
            raise RuntimeError("killed mid-write")
    assert target.read_text().strip().startswith('{\n  "v": 1')
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp file left behind


def test_atomic_dir_replaces_only_on_success(tmp_path):
    target = tmp_path / "sae"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(ValueError):
        with atomic_dir(target) as tmp:
            (tmp / "a.txt").write_text("second")
            raise ValueError("boom")
    assert (target / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sae"]


def test_hashes_depend_on_content_and_names(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"x" * 10)
    assert sha256_file(a) == sha256_file(b)
    assert sha256_files([a]) != sha256_files([b])
    b.write_bytes(b"y" * 10)
    assert sha256_file(a) != sha256_file(b)


def test_outputs_get_the_usual_permissions_not_private_ones(tmp_path):
    write_json(tmp_path / "shared.json", {})
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "x").write_text("")
    assert (tmp_path / "shared.json").stat().st_mode & 0o044 == 0o044  # group/other can read
    assert (tmp_path / "d").stat().st_mode & 0o055 == 0o055


def test_json_outputs_are_strict_json(tmp_path):
    import json

    import numpy as np

    write_json(tmp_path / "m.json", {"a": float("nan"), "b": [np.float32(1.5), float("inf")]})
    text = (tmp_path / "m.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {
        "a": None,
        "b": [1.5, None],
    }
