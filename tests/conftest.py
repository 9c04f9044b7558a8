"""Shared fixtures: a Snakemake runner, tiny configs, and a tiny Hugging Face model directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

# A small but real embedded model: trains in seconds; too short to learn the behaviours well.
TINY_EMBEDDED = {
    "embedded": {"training": {"steps": 150, "log_every": 50, "batch_size": 16}},
    "behaviours": {
        "induction": {"source": "induction", "n_prompts": 24},
        "facts": {"source": "facts", "n_prompts": 24},
    },
    "capture": {"n_tokens": 16384},
    "sae": {
        "total_tokens": 40960,
        "batch_size": 512,
        "checkpoint_every_tokens": 20480,
        "dead_window_tokens": 20480,
        "eval_contexts": 16,
    },
    # A few random circuits: a few hundred candidate nodes x 10 draws is most of the stage.
    "interventions": {"n_random_circuits": 3},
}


def run_snakemake(config: dict, workdir: Path, *args: str, check: bool = True):
    """Run the real workflow (Snakemake's CLI) with `config` written to a file in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"outdir": str(workdir / "results"), **config}
    cfg_file = workdir / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(config))
    cmd = [
        *SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(REPO),
        "--configfile",
        str(cfg_file),
        "--cores",
        "2",
        *args,
    ]
    # Rules call `python`: make it this interpreter, as an activated environment would.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=1800)
    if check and done.returncode != 0:
        raise AssertionError(f"snakemake failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="session")
def tiny_hf_model_dir(tmp_path_factory) -> Path:
    """A GPT-2-architecture Hugging Face model with random weights and a byte-level BPE tokenizer
    trained here on a few sentences (names, places, capitals), saved locally: no download."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from circuitflow.behaviours import CAPITALS, IOI_NAMES, IOI_OBJECTS, IOI_PLACES, IOI_TEMPLATES

    path = tmp_path_factory.mktemp("tiny-gpt2")
    corpus = [t.replace("{A}", "Mary").replace("{B}", "John") for t in IOI_TEMPLATES]
    corpus += [" ".join(IOI_NAMES), " ".join(IOI_PLACES), " ".join(IOI_OBJECTS)]
    corpus += [f"The capital of {c} is the city of {k}" for c, k in CAPITALS.items()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        corpus * 20, vocab_size=600, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    tokenizer = GPT2TokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    # n_ctx as in the real gpt2 config.json (TransformerLens reads it).
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=64, n_ctx=64, n_embd=32, n_layer=2, n_head=2
    )
    import torch

    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def default_results(tmp_path_factory) -> Path:
    """The whole DAG on the embedded default config (config/config.yaml), once per test session.
    Tests of the science (accuracy, circuits, SAE quality) read its outputs.
    CIRCUITFLOW_DEFAULT_RESULTS=<results dir of a default run> reuses one instead (development)."""
    reuse = os.environ.get("CIRCUITFLOW_DEFAULT_RESULTS")
    if reuse:
        return Path(reuse)
    workdir = tmp_path_factory.mktemp("default-run")
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config.pop("outdir")  # results go to this test's directory, not the checkout's results/
    run_snakemake(config, workdir)
    return workdir / "results"
