"""Every stage script is a real command-line program: --help works, bad input exits non-zero
with one line that names the problem."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from helpers.dag import REPO

SCRIPTS = sorted(p for p in (REPO / "scripts").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_help(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_missing_model_is_one_clear_line(tmp_path):
    args = ["--config", tmp_path / "x.yaml", "--behaviour", "induction"]
    args += ["--model-json", tmp_path / "model.json", "--out", tmp_path / "p.parquet"]
    script = REPO / "scripts" / "prompts.py"
    done = subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: config file")
    assert "x.yaml does not exist" in done.stderr
    assert not (tmp_path / "p.parquet").exists()


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device", "/out/acts.h5"),
        RuntimeError("Can't write data (file write failed: errno = 28, 'No space left on device')"),
    ],
    ids=["os", "h5py"],
)
def test_full_disk_is_one_line_and_its_own_exit_status(error, capsys):
    from circuitflow.cli import main
    from circuitflow.errors import EXIT_NO_SPACE

    def run():
        raise error

    with pytest.raises(SystemExit) as info:
        main(run)
    assert info.value.code == EXIT_NO_SPACE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: no space left on device")
    assert "rerun the same command" in err


def test_other_runtime_errors_keep_their_traceback():
    from circuitflow.cli import main

    def run():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        main(run)


# ------------------------------------------------------------ circuitflow.cli's arguments ------
class _Parsed(Exception):
    """Raised in place of parsing: carries the parser a script built."""


def _script_parser(script, monkeypatch) -> argparse.ArgumentParser:
    """The parser `script` builds, taken from its call to cli.parse (no stage runs)."""
    import runpy

    from circuitflow import cli

    def capture(parser):
        raise _Parsed(parser)

    monkeypatch.setattr(cli, "parse", capture)
    monkeypatch.setattr(sys, "argv", [str(script)])
    with pytest.raises(_Parsed) as got:
        runpy.run_path(str(script), run_name="__main__")
    return got.value.args[0]


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


# Shared names a script takes in its own way, and why.
OWN_ARGUMENTS = {
    ("check_env", "config"): "optional: defaults to config/config.yaml",
    ("gpu_hours", "config"): "optional: defaults to config/qwen2.5-0.5b.yaml",
    ("report", "saes"): "`report sae` summarises one or more SAEs: required, nargs='+'",
}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_scripts_parse_through_cli_with_the_shared_arguments(script, monkeypatch):
    """Every script parses through cli.parse, and an argument several stages share (--config,
    --model-json, --saes, ...) takes the same values (required, nargs, default) everywhere."""
    from circuitflow.cli import SHARED_ARGUMENTS

    parser = _script_parser(script, monkeypatch)
    assert parser.description and parser.description.strip() in script.read_text()
    for p in _parsers(parser):
        for action in p._actions:
            name = action.option_strings[0][2:] if action.option_strings else None
            if name not in SHARED_ARGUMENTS or (script.stem, name) in OWN_ARGUMENTS:
                continue
            spec = SHARED_ARGUMENTS[name]
            assert action.required == spec.get("required", False), (p.prog, name)
            assert action.nargs == spec.get("nargs"), (p.prog, name)
            assert action.default == spec.get("default"), (p.prog, name)
            assert action.help, (p.prog, name)


def test_cli_helpers_build_and_parse(monkeypatch, capsys):
    from circuitflow import cli

    p = cli.parser("what this does")
    cli.add_inputs(p, "config", "model-json", "saes", model_json="a narrower help")
    cli.add_outputs(p, "json", "pip-freeze", json="summary to write")
    config_file = REPO / "config" / "config.yaml"
    argv = ["x", "--config", str(config_file), "--model-json", "m", "--out-json", "o.json"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out-pip-freeze", "f.txt"])
    args, config = cli.parse(p)
    assert (args.model_json, args.saes, args.out_json, args.out_pip_freeze) == (
        "m", [], "o.json", "f.txt"
    )  # fmt: skip
    assert config["layers"] and config["outdir"]  # loaded and checked
    text = p.format_help()
    assert "resolved config JSON or a config YAML" in text and "a narrower help" in text
    assert "summary to write" in text and "the model stage's model.json" not in text
    monkeypatch.setattr(sys, "argv", argv[:3])  # outputs and --model-json missing
    with pytest.raises(SystemExit) as info:
        cli.parse(p)
    assert info.value.code == 2 and "--model-json, --out-json, --out-pip-freeze" in (
        capsys.readouterr().err
    )
    q = cli.parser(None)
    cli.add_outputs(q, "csv")
    monkeypatch.setattr(sys, "argv", ["x", "--out-csv", "c"])
    assert cli.parse(q)[1] is None  # no --config: nothing loaded
