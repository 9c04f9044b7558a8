"""Every kind of bad input a stage can be handed is refused before work starts: exit status 2
(errors.EXIT_BAD_INPUT), one line naming the file (or the config key), no traceback, and no
finished output changed. A damaged SAE checkpoint is the exception by design: it is set aside
with a warning and training goes on (a Slurm retry must not fail on it again).

Each case copies the small finished run (conftest.small_results), damages one input, and runs
the stage script that reads it with the arguments its rule passes, writing to the rule's own
output paths. Config cases go through Snakemake's CLI (`snakemake -n`) on the same results.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import h5py
import pandas as pd
import pytest
import yaml
from helpers.dag import REPO, SNAKEMAKE, load_test_config

from circuitflow import config as cf
from circuitflow.errors import EXIT_BAD_INPUT

pytestmark = pytest.mark.slow

SAE = "saes/resid_post/layer_1"
ACTS = "activations/resid_post/layer_1.h5"
ATTR = "attribution/induction"


def stage_args(stage: str, r: Path, config: str) -> list[str]:
    """The stage script's command line as its rule writes it, on results directory `r`."""
    common = ["--config", config, "--model-json", f"{r}/model/model.json"]
    prompts = ["--behaviour", "induction", "--prompts", f"{r}/prompts/induction.parquet"]
    if stage == "baseline":
        b = f"{r}/baseline/induction"
        outs = ["--out-json", f"{b}.json", "--out-parquet", f"{b}.parquet"]
        return [*common, *prompts, *outs, "--out-figure", f"{b}_calibration.png"]
    if stage == "capture":
        tokens = ["--tokens-npy", f"{r}/activations/tokens.npy"]
        tokens += ["--tokens-json", f"{r}/activations/tokens.json"]
        return ["run", *common, *tokens, "--out-dir", f"{r}/activations"]
    if stage == "train_sae":
        ckpt = f"{r}/checkpoints/{SAE}"
        outs = ["--out", f"{r}/{SAE}", "--checkpoint-dir", ckpt]
        return [*common, "--activations", f"{r}/{ACTS}", *outs]
    if stage == "attribution":
        saes = ["--saes", f"{r}/{SAE}", "--activations", f"{r}/{ACTS}"]
        return [*common, *prompts, *saes, "--out-dir", f"{r}/{ATTR}"]
    if stage == "interventions":
        attr = ["--attribution-dir", f"{r}/{ATTR}", "--saes", f"{r}/{SAE}"]
        return ["behaviour", *common, *prompts, *attr, "--out-dir", f"{r}/interventions/induction"]
    raise ValueError(stage)


# --- ways to damage a file ------------------------------------------------------------------------
def garbage(path: Path) -> None:
    path.write_bytes(b"\x00not what it claims to be\xff" * 8)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def drop_column(column: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        pd.read_parquet(path).drop(columns=[column]).to_parquet(path)

    return damage


def drop_json_key(key: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        obj = json.loads(path.read_text())
        obj.pop(key)
        path.write_text(json.dumps(obj))

    return damage


def drop_tensor(name: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(path)
        tensors.pop(name)
        save_file(tensors, path)

    return damage


def change_a_weight(path: Path) -> None:
    """A well-formed safetensors file that is not the one model.json describes."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    name = max(sorted(tensors), key=lambda n: tensors[n].numel())  # a weight, not a -inf mask
    tensors[name] = tensors[name] + 1
    save_file(tensors, path)


def drop_h5_attribute(name: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with h5py.File(path, "r+") as f:
            del f.attrs[name]

    return damage


# kind -> (the file damaged, how, the stage that reads it). At least one case per input a stage
# reads: prompts, model.json, model weights, token set, activation HDF5, SAE cfg.json and
# weights, attribution tables and graph.
CASES = {
    "prompts parquet not parquet": ("prompts/induction.parquet", garbage, "baseline"),
    "prompts parquet missing a column": (
        "prompts/induction.parquet",
        drop_column("corrupted_tokens"),
        "attribution",
    ),
    "model.json truncated": ("model/model.json", truncate, "baseline"),
    "model.json missing a key": ("model/model.json", drop_json_key("weights_sha256"), "capture"),
    "model weights truncated": ("model/weights.safetensors", truncate, "capture"),
    "model weights not the recorded ones": (
        "model/weights.safetensors",
        change_a_weight,
        "interventions",
    ),
    "model tokenizer missing": ("model/tokenizer/tokenizer.json", Path.unlink, "baseline"),
    "token set truncated": ("activations/tokens.npy", truncate, "capture"),
    "token set description not JSON": ("activations/tokens.json", garbage, "capture"),
    "activation file truncated": (ACTS, truncate, "train_sae"),
    "activation file not HDF5": (ACTS, garbage, "attribution"),
    "activation file missing an attribute": (ACTS, drop_h5_attribute("hook_name"), "train_sae"),
    "SAE weights corrupt": (f"{SAE}/sae_weights.safetensors", garbage, "attribution"),
    "SAE weights truncated": (f"{SAE}/sae_weights.safetensors", truncate, "interventions"),
    "SAE weights missing a tensor": (
        f"{SAE}/sae_weights.safetensors",
        drop_tensor("W_dec"),
        "attribution",
    ),
    "SAE cfg.json not JSON": (f"{SAE}/cfg.json", garbage, "interventions"),
    "SAE cfg.json missing": (f"{SAE}/cfg.json", Path.unlink, "attribution"),
    "attribution table not parquet": (f"{ATTR}/heads.parquet", garbage, "interventions"),
    "attribution table missing a column": (
        f"{ATTR}/components.parquet",
        drop_column("score_selection"),
        "interventions",
    ),
    "attribution graph truncated": (f"{ATTR}/graph.json", truncate, "interventions"),
}


def digests(root: Path, skip: Path | None = None) -> dict[str, str]:
    """SHA-256 of every file under `root` (logs and benchmarks aside: not results)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and path != skip and rel.parts[0] not in ("logs", "benchmarks"):
            out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def small_config(small_results) -> dict:
    raw = {"outdir": str(small_results), **load_test_config("small")}
    return cf.resolve(raw, REPO)


def run_stage(stage: str, results: Path, config: dict) -> subprocess.CompletedProcess:
    script = REPO / "scripts" / f"{stage}.py"
    args = stage_args(stage, results, json.dumps(config))
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600
    )


def assert_one_line_error(done: subprocess.CompletedProcess, names: str) -> str:
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), done.stderr
    assert names in line, f"{names!r} not named in {line!r}"
    return line


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_input_is_refused_in_one_line(kind, small_results, small_config, tmp_path):
    rel, damage, stage = CASES[kind]
    results = tmp_path / "results"
    shutil.copytree(small_results, results)
    target = results / rel
    before = digests(results, skip=target)
    damage(target)
    done = run_stage(stage, results, small_config | {"outdir": str(results)})
    assert_one_line_error(done, str(target))
    assert digests(results, skip=target) == before, "a finished output changed"


def test_corrupt_checkpoint_is_set_aside_and_training_restarts(
    small_results, small_config, tmp_path
):
    """Not refused: a retry on Slurm would fail on the same file forever. The stage warns, sets
    the checkpoint aside and trains from the start; the finished outputs are untouched."""
    results = tmp_path / "results"
    shutil.copytree(small_results, results)
    before = digests(results)
    bad = results / "checkpoints" / SAE / "step_000000004"
    bad.mkdir(parents=True)
    (bad / "state.json").write_text('{"format": 1, "tensors_sha2')
    (bad / "tensors.safetensors").write_bytes(b"\x00" * 64)
    retrained = tmp_path / "retrained"
    args = stage_args("train_sae", results, json.dumps(small_config | {"outdir": str(results)}))
    args[args.index("--out") + 1] = str(retrained)
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_sae.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert f"{bad}: unreadable checkpoint state" in done.stdout + done.stderr
    assert "set aside" in done.stdout + done.stderr
    assert json.loads((retrained / "metrics.json").read_text())["resumed"] is False
    assert digests(results) == before


# Config values each valid alone that cannot work together: refused at validation, before any
# job runs, with the key named.
BAD_COMBINATIONS = {
    "sae.k above d_sae": ({"sae": {"k": 100000, "d_sae": 64}}, "sae.k: 100000"),
    "sae.target_l0 not below d_sae": (
        {"sae": {"architecture": "jumprelu", "d_sae": 16, "target_l0": 16}},
        "sae.target_l0: 16",
    ),
    "sae.batch_size above total_tokens": (
        {"sae": {"batch_size": 4096, "total_tokens": 2048}},
        "sae.batch_size: 4096 exceeds sae.total_tokens",
    ),
    "sae.batch_size above the captured rows": (
        {"sae": {"batch_size": 16384, "total_tokens": 32768}},
        "sae.batch_size: 16384 exceeds the activation rows captured",
    ),
    "capture.context_length beyond the model": (
        {"capture": {"context_length": 64}},
        "capture.context_length: 64 exceeds the model's context",
    ),
    "capture.n_tokens below one context": (
        {"capture": {"n_tokens": 16}, "sae": {"batch_size": 8, "total_tokens": 16}},
        "capture.n_tokens: 16 is less than one context",
    ),
    "capture.shards above the checkpoint units": (
        {"capture": {"shards": 16}},
        "capture.shards: 16 shards for 8 checkpoint units",
    ),
}


def merged(base: dict, change: dict) -> dict:
    out = dict(base)
    for key, value in change.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize("kind", sorted(BAD_COMBINATIONS))
def test_bad_config_combination_is_refused_before_any_job(kind, small_results, tmp_path):
    change, message = BAD_COMBINATIONS[kind]
    results = tmp_path / "results"
    shutil.copytree(small_results, results)
    before = digests(results)
    config = merged({"outdir": str(results), **load_test_config("small")}, change)
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(REPO)]
        + ["--configfile", str(cfg_file), "--cores", "1", "-n"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode != 0
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "config error:" in ln]
    assert len(lines) == 1 and message in lines[0], done.stdout + done.stderr
    assert digests(results) == before
