"""`source: file` behaviours: the user's prompt file is read and checked when the config is
validated (before any job), a relative `path` resolves against the folder of the config file
that sets it and is stored absolute, and the prompts job refuses what validation could not check
(a multi-token answer when the model's tokenizer is not available offline) in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers.dag import REPO, run_snakemake

from circuitflow import config as cf
from circuitflow import prompts
from circuitflow.errors import EXIT_BAD_INPUT

# Induction prompts in the embedded model's synthetic language (words r0..r63): a segment, then
# its first three words again; the answer is the segment's fourth word.
SEGMENTS = [[5, 9, 14, 2, 33, 40, 7, 21], [11, 3, 60, 17, 8, 25, 44, 1], [30, 12, 6, 50, 19, 4]]
SEGMENTS += [[13, 27, 45, 36, 22, 58], [41, 16, 52, 10, 63, 29]]


def embedded_rows() -> list[dict]:
    return [
        {
            "prompt": " ".join(f"r{t}" for t in seg + seg[:3]),
            "answer": f"r{seg[3]}",
            "distractor": f"r{seg[4]}",
        }
        for seg in SEGMENTS
    ]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_config(path: Path, behaviour: dict, **extra) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"behaviours": {"mine": behaviour}, **extra}))
    return path


# --- where a relative path resolves ---------------------------------------------------------------
def test_relative_path_resolves_against_the_config_files_folder(tmp_path, monkeypatch):
    """Not against the directory the run starts in; the resolved config holds the absolute path
    (jobs read it from there, whatever their working directory)."""
    csv = write_rows(tmp_path / "project" / "data" / "mine.csv", embedded_rows())
    cfg = write_config(
        tmp_path / "project" / "run.yaml",
        {"source": "file", "path": "data/mine.csv", "n_prompts": 5},
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_rows(elsewhere / "data" / "mine.csv", embedded_rows()[:1])  # a decoy the cwd would find
    monkeypatch.chdir(elsewhere)
    resolved = cf.load(cfg)
    assert resolved["behaviours"]["mine"]["path"] == str(csv)
    assert Path(resolved["behaviours"]["mine"]["path"]).is_absolute()


def test_the_last_config_file_that_sets_the_path_decides_and_the_command_line_uses_the_cwd(
    tmp_path,
):
    """Several --configfile: the last one that sets behaviours.<name>.path gives the folder; a
    --config override resolves against the working directory, and the error says so."""
    first = write_config(tmp_path / "a" / "one.yaml", {"source": "file", "path": "mine.csv"})
    second = tmp_path / "b" / "two.yaml"
    second.parent.mkdir()
    second.write_text(yaml.safe_dump({"seed": 3}))  # sets no path
    write_rows(tmp_path / "a" / "mine.csv", embedded_rows())
    raw = {"behaviours": {"mine": {"source": "file", "path": "mine.csv", "n_prompts": 5}}}
    resolved = cf.resolve(raw, tmp_path / "cwd", config_files=[first, second])
    assert resolved["behaviours"]["mine"]["path"] == str(tmp_path / "a" / "mine.csv")

    second.write_text(yaml.safe_dump({"behaviours": {"mine": {"path": "mine.csv"}}}))
    with pytest.raises(cf.ConfigError) as info:
        cf.resolve(raw, tmp_path / "cwd", config_files=[first, second])
    assert str(info.value) == (
        f"behaviours.mine.path: file {tmp_path / 'b' / 'mine.csv'} does not exist ('mine.csv' "
        f"resolved against the folder of config file {second})"
    )

    overrides = {"behaviours": {"mine": {"path": "mine.csv"}}}
    with pytest.raises(cf.ConfigError) as info:
        cf.resolve(raw, tmp_path / "cwd", config_files=[first], overrides=overrides)
    assert f"file {tmp_path / 'cwd' / 'mine.csv'} does not exist" in str(info.value)
    assert "the working directory" in str(info.value) and "from --config" in str(info.value)


# --- what validation refuses, before any job ------------------------------------------------------
def _drop(column: str):
    return lambda rows: [{k: v for k, v in row.items() if k != column} for row in rows]


def _set(row: int, column: str, value):
    def change(rows):
        rows[row - 1][column] = value
        return rows

    return change


# case -> (file name, how the good rows are changed, n_prompts, words the one line must hold)
BAD_FILES = {
    "missing distractor column": (
        "mine.csv",
        _drop("distractor"),
        5,
        ["missing column(s) distractor", "columns found: prompt, answer"],
    ),
    "empty answer cell": ("mine.csv", _set(2, "answer", ""), 5, ["row 2: answer is empty"]),
    "JSON null distractor": (
        "mine.jsonl",
        _set(4, "distractor", None),
        5,
        ["row 4: distractor is empty"],
    ),
    "fewer rows than n_prompts": (
        "mine.csv",
        lambda rows: rows,
        256,
        ["holds 5 prompt rows but behaviours.mine.n_prompts asks for 256", "at most 5"],
    ),
    "multi-token answer": (
        "mine.csv",
        _set(3, "answer", "r50 r19"),
        5,
        ["row 3: answer 'r50 r19' is 2 tokens ('r50' + 'r19')"],
    ),
    "multi-token distractor": (
        "mine.jsonl",
        _set(5, "distractor", "r1 r2 r3"),
        5,
        ["row 5: distractor 'r1 r2 r3' is 3 tokens"],
    ),
    "word outside the vocabulary": (
        "mine.csv",
        _set(1, "answer", "Paris"),
        5,
        ["row 1: answer 'Paris' is not in the model's vocabulary"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_prompt_file_is_refused_at_validation_in_one_line(case, tmp_path):
    name, change, n_prompts, words = BAD_FILES[case]
    data = write_rows(tmp_path / "cfg" / name, change(embedded_rows()))
    cfg = write_config(
        tmp_path / "cfg" / "run.yaml", {"source": "file", "path": name, "n_prompts": n_prompts}
    )
    with pytest.raises(cf.ConfigError) as info:
        cf.load(cfg)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"behaviours.mine.path: {data}: "), message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_a_broken_json_lines_file_names_its_line(tmp_path):
    data = tmp_path / "mine.jsonl"
    rows = [json.dumps(row) for row in embedded_rows()]
    data.write_text("\n".join([rows[0], "", rows[1][:-5], *rows[2:]]) + "\n")
    with pytest.raises(cf.ConfigError) as info:
        cf.resolve({"behaviours": {"mine": {"source": "file", "path": str(data)}}})
    assert str(info.value).startswith(f"behaviours.mine.path: {data}: line 3 is not JSON (")


def test_a_good_file_resolves_and_the_job_reads_the_same_rows(tmp_path, monkeypatch):
    """Validation passes a good file; the stage, run from another directory on the resolved
    config (as a job is), makes one prompt a row with the file's answers as single tokens."""
    rows = embedded_rows()
    write_rows(tmp_path / "cfg" / "mine.jsonl", rows)
    cfg = write_config(
        tmp_path / "cfg" / "run.yaml", {"source": "file", "path": "mine.jsonl", "n_prompts": 4}
    )
    resolved = cf.load(cfg)
    model_dir = fake_model_dir(tmp_path / "model", embedded_language(resolved))
    monkeypatch.chdir(tmp_path)  # not the config's folder: the path must be absolute
    out = tmp_path / "results" / "mine.parquet"
    frame = prompts.run(json.loads(json.dumps(resolved)), "mine", model_dir, out)
    assert out.is_file() and len(frame) == 4
    assert list(frame.answer_text) == [r["answer"] for r in rows[:4]]
    assert list(frame.distractor_text) == [r["distractor"] for r in rows[:4]]
    assert list(frame.clean_text) == [r["prompt"] for r in rows[:4]]


# --- the prompts job: what validation could not check ---------------------------------------------
def embedded_language(resolved: dict) -> dict:
    return dict(resolved["embedded"]["language"], seed=resolved["seed"])


def fake_model_dir(path: Path, language: dict | None = None, hf_dir: Path | None = None) -> Path:
    """A model stage's model.json (no weights: the prompts stage reads only the tokenizer)."""
    path.mkdir(parents=True, exist_ok=True)
    info = {"architecture": {}, "weights_sha256": "-"}
    if hf_dir is None:
        info |= {"kind": "embedded", "language": language}
    else:
        info |= {"kind": "local_hf", "path": str(hf_dir)}
    (path / "model.json").write_text(json.dumps(info))
    return path


IOI_ROWS = [
    {
        "prompt": "Then, John and Mary went to the store. John gave a ring to",
        "answer": " Mary",
        "distractor": " John",
    },
    {
        "prompt": "Then, Mary and John went to the store. Mary gave a ring to",
        "answer": " John",
        "distractor": " Mary",
    },
    {
        "prompt": "The capital of Sweden is the city of",
        "answer": " Stockholm",  # four tokens for .test/tiny-gpt2's tokenizer
        "distractor": " Mary",
        "corrupted_prompt": "The capital of Norway is the city of",
    },
]


def test_real_model_offline_tokenizer_checks_tokens_at_validation(tiny_hf_model_dir, tmp_path):
    """A local model directory's tokenizer is at hand: the multi-token answer is refused before
    any job, naming the file, the row and the pieces."""
    data = write_rows(tmp_path / "ioi.csv", IOI_ROWS)
    raw = {
        "model": {"name": str(tiny_hf_model_dir)},
        "capture": {"corpus": "corpus.txt"},
        "behaviours": {"mine": {"source": "file", "path": "ioi.csv", "n_prompts": 3}},
    }
    with pytest.raises(cf.ConfigError) as info:
        cf.resolve(raw, tmp_path)
    assert str(info.value) == (
        f"behaviours.mine.path: {data}: row 3: answer ' Stockholm' is 4 tokens (' St' + 'ock' + "
        "'hol' + 'm'); it must be one token of the model's tokenizer"
    )
    raw["behaviours"]["mine"]["n_prompts"] = 2  # the rows used are checked, not the rest
    notes: list[str] = []
    assert cf.resolve(raw, tmp_path, notes=notes)["behaviours"]["mine"]["path"] == str(data)
    assert notes == []  # the tokens were checked: nothing deferred


DEFERRED = (
    "config note: behaviours.mine.path: answer and distractor tokens not checked now (no "
    "tokenizer of gpt2 offline here); each prompts job checks them and stops on a bad row (to "
    "check them now, run `snakemake prefetch_model --configfile <your config>` first)"
)


def test_hub_model_not_cached_leaves_tokens_to_the_job_but_checks_columns(tmp_path):
    """No tokenizer offline (an empty Hugging Face cache): columns and rows are still checked at
    validation; the token check waits for the prompts job."""
    data = write_rows(tmp_path / "ioi.csv", IOI_ROWS)
    model = {"name": "gpt2", "n_layers": 12, "hf_cache": str(tmp_path / "empty-cache")}
    raw = {
        "model": model,
        "capture": {"corpus": "corpus.txt"},
        "behaviours": {"mine": {"source": "file", "path": str(data), "n_prompts": 3}},
    }
    assert cf.offline_tokenizer(cf.resolve({**raw, "behaviours": {"x": {"source": "ioi"}}})) is None
    notes: list[str] = []
    assert cf.resolve(raw, notes=notes)["behaviours"]["mine"]["path"] == str(data)
    assert notes == [DEFERRED]
    write_rows(data, _drop("answer")(IOI_ROWS))
    with pytest.raises(cf.ConfigError, match=r"ioi\.csv: missing column\(s\) answer"):
        cf.resolve(raw)


def test_prompts_job_refuses_a_multi_token_answer_in_one_line(tiny_hf_model_dir, tmp_path):
    """The stage script as its rule runs it, on a model whose tokenizer validation could not
    load: exit 2, one line naming the key, the file, the row and the token count; no output."""
    data = write_rows(tmp_path / "ioi.csv", IOI_ROWS)
    config = {"seed": 0, "behaviours": {"mine": {"source": "file", "path": str(data)}}}
    config["behaviours"]["mine"]["n_prompts"] = 3
    model_dir = fake_model_dir(tmp_path / "model", hf_dir=tiny_hf_model_dir)
    out = tmp_path / "prompts" / "mine.parquet"
    args = ["--config", json.dumps(config), "--behaviour", "mine"]
    args += ["--model-json", str(model_dir / "model.json"), "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prompts.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: behaviours.mine.path: {data}: row 3: answer ' Stockholm' is 4 tokens (' St' + "
        "'ock' + 'hol' + 'm'); it must be one token of the model's tokenizer"
    )
    assert not out.exists()


def test_factual_recall_still_scores_a_split_capital_on_its_first_token(tiny_hf_model_dir):
    """The generator keeps its deliberate first-token answers (unchanged results): only user
    files are held to one token."""
    from transformers import AutoTokenizer

    encoder = prompts.Encoder(AutoTokenizer.from_pretrained(tiny_hf_model_dir))
    frame = prompts.factual_recall_prompts(encoder, prompts.behaviour_rng(0, "capitals"), 40)
    stockholm = encoder.tokenizer.encode(" Stockholm", add_special_tokens=False)
    sweden = frame[frame.clean_text.str.contains("Sweden")]
    assert len(stockholm) > 1 and len(sweden) > 0
    assert set(sweden.answer_id) == {stockholm[0]}


# --- through Snakemake's CLI ----------------------------------------------------------------------
def test_dry_run_refuses_a_file_without_distractor_before_any_job(tmp_path):
    """The issue's case: `snakemake -n` used to plan every job; now it stops at validation."""
    rows = _drop("distractor")(embedded_rows())
    data = write_rows(tmp_path / "mine.csv", rows)
    config = {"behaviours": {"mine": {"source": "file", "path": "mine.csv", "n_prompts": 5}}}
    done = run_snakemake(config, tmp_path, "-n", check=False)
    assert done.returncode != 0
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "config error:" in ln]
    assert lines == [
        f"config error: behaviours.mine.path: {data}: missing column(s) distractor (columns "
        "found: prompt, answer); a prompt file needs prompt, answer and distractor"
    ]
    assert not (tmp_path / "results").exists()


def test_dry_run_resolves_a_relative_path_against_the_config_file(tmp_path):
    """run_snakemake runs in the repository (--directory): the relative path still means the
    file beside the config, and the prompts job's command line carries it absolute."""
    data = write_rows(tmp_path / "mine.csv", embedded_rows())
    config = {"behaviours": {"mine": {"source": "file", "path": "mine.csv", "n_prompts": 5}}}
    done = run_snakemake(config, tmp_path, "-n", "-p")
    shell = [ln for ln in done.stdout.splitlines() if "scripts/prompts.py" in ln]
    assert shell, done.stdout
    cfg = json.loads(shell[0].split("--config ", 1)[1].split("'")[1])
    assert cfg["behaviours"]["mine"]["path"] == str(data)


def test_dry_run_says_once_that_the_token_checks_wait_for_the_job(tmp_path):
    """No tokenizer offline and a multi-token answer (row 3): the dry run plans the jobs (exit
    0) and says, once, that the prompts job checks the tokens."""
    write_rows(tmp_path / "ioi.csv", IOI_ROWS)
    model = {"name": "gpt2", "n_layers": 12, "hf_cache": str(tmp_path / "empty-cache")}
    config = {
        "model": model,
        "capture": {"corpus": "corpus.txt"},
        "behaviours": {"mine": {"source": "file", "path": "ioi.csv", "n_prompts": 3}},
    }
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = run_snakemake(config, tmp_path, "-n", env=offline)
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "config note:" in ln]
    assert lines == [DEFERRED]
