"""Every command README.md and docs/*.md show works as written.

The commands are read from the docs themselves: every line of a ```bash block (backslash
continuations joined, comments dropped, `&&`/`;`/`|` chains split) and every inline code span
that is a `snakemake` or `make` command or `python` with arguments. Each is checked for what it
is:

- `snakemake ...`: parsed by Snakemake's own argument parser (so a target that `--configfile`
  swallows as a second config file is named as such), then run in a fresh copy of the working
  tree (tracked and untracked files, not ignored ones: nothing is written into the checkout) as
  a dry run (`-n` added); `--unlock` and `--lint` change nothing but that copy and run as they
  are; `--report` needs a finished run, so the same command is dry-run without `--report FILE`,
  which resolves its --configfile, --profile and targets against the DAG. Rule names among the
  targets must appear in the dry run's job list. The Slurm profiles get their accounts'
  variables (`CSD3_ACCOUNT`, profiles/slurm-h100's `SLURM_PROJECT`); the
  Hugging Face cache is empty and the network is off (offline flags, a dead proxy), so the real
  models' configs must resolve offline (`model.n_layers`), as a first run on a login node does.
- `python <script> ...` / `python -m <module> ...`: the script exists and `--help` exits 0 and
  lists every option the command uses.
- `make <target> VAR=...`: `make -n` knows the targets and the Makefile assigns the variables.
- Anything else must be one of EXTERNAL (shell built-ins and tools of other machines).

Repository paths a command names (config/, profiles/, scripts/, ...) must exist. Placeholders
in angle brackets (`<this repository>`) stand for the reader's values and are not checked.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.dag import REPO, SNAKEMAKE

pytestmark = pytest.mark.slow

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# Shell built-ins and tools of other machines (the cluster, git hosting) the docs show.
EXTERNAL = {".", "source", "cd", "export", "module", "git", "ssh", "tmux", "squeue", "pytest"}
# Files a command names that stand for the reader's own: a stand-in goes into the copy.
READERS_FILES = {"my.yaml": "outdir: results/my\n"}
# Folders of the repository: a path under one that a command names must exist.
REPO_DIRS = (".test/", "benchmarks/", "config/", "docs/", "profiles/", "scripts/", "workflow/")
PLACEHOLDER = "PLACEHOLDER"
# The dry runs' environment: the profile's account, an empty Hugging Face cache, no network.
DEAD_PROXY = "http://127.0.0.1:9"
OFFLINE = {
    "CSD3_ACCOUNT": "DOCTEST-SL2",
    "SLURM_PROJECT": "doctest",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    **{k: DEAD_PROXY for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
    **{k: DEAD_PROXY for k in ("http_proxy", "https_proxy", "all_proxy")},
    "NO_PROXY": "",
    "no_proxy": "",
}


@dataclass(frozen=True)
class Command:
    doc: str  # path under the repository
    line: int
    words: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}: {' '.join(self.words)}"


def _simple_commands(text: str) -> list[tuple[str, ...]]:
    """Shell words of `text`, comments dropped, split at `&&`, `||`, `;` and `|`; leading
    VAR=value assignments dropped; `<...>` placeholders made one word."""
    text = re.sub(r"<[^<>\n]*>", PLACEHOLDER, text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, current = [], []
    for word in lexer:
        if set(word) <= set(";&|"):
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    out = []
    for words in commands:
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            words = words[1:]
        if words:
            out.append(tuple(words))
    return out


def _block_commands(doc: str, lines: list[str]) -> list[Command]:
    commands, lang, start, pending = [], None, 0, ""
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence:
            lang = None if lang is not None else fence.group(1).lower()
            continue
        if lang not in SHELL_LANGS:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        for words in _simple_commands(pending + line):
            commands.append(Command(doc, start, words))
        pending = ""
    return commands


def _inline_commands(doc: str, lines: list[str]) -> list[Command]:
    """Code spans in the prose (code blocks blanked) that start with a command checked here."""
    prose, in_block = [], False
    for line in lines:
        if re.match(r"^\s*```", line):
            in_block = not in_block
            prose.append("")
        else:
            prose.append("" if in_block else line)
    text = "\n".join(prose)
    commands = []
    for match in re.finditer(r"`([^`]+)`", text):
        span = " ".join(match.group(1).split())
        # A bare `python` is a name (environment.json's key), not a command.
        if "\n\n" in match.group(1) or not re.match(r"^(snakemake|make)( |$)|^python3? ", span):
            continue
        line = text.count("\n", 0, match.start()) + 1
        commands += [Command(doc, line, w) for w in _simple_commands(span)]
    return commands


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        doc, lines = str(path.relative_to(REPO)), path.read_text().splitlines()
        commands += _block_commands(doc, lines) + _inline_commands(doc, lines)
    return commands


COMMANDS = documented_commands()


def _snakemake_args(words: tuple[str, ...]):
    """Snakemake's own parser applied to the command (no profile: the profile's values are
    appended after the command's own words, so they cannot change how those parse); None
    when it rejects the command."""
    from snakemake.cli import get_argument_parser

    try:
        return get_argument_parser().parse_args(list(words[1:]))
    except SystemExit:
        return None


def _check_argv(words: tuple[str, ...]) -> tuple[list[str], str] | None:
    """The command line that checks a documented snakemake command, and what it must print."""
    args = _snakemake_args(words)
    if args is None:
        return None
    argv = list(words[1:])
    if args.unlock:
        return argv, "Unlocked working directory."
    if args.lint:
        return argv, ""
    if args.report:
        i = next(i for i, w in enumerate(argv) if w.split("=")[0] == "--report")
        value = "=" not in argv[i] and i + 1 < len(argv) and argv[i + 1] == str(args.report)
        del argv[i : i + 1 + value]
    # -n first (a flag: where it stands changes nothing), so commands that differ only in
    # where they put it share one run.
    argv = ["-n", *(w for w in argv if w not in ("-n", "--dry-run", "--dryrun"))]
    return argv, "This was a dry-run"


def _check_line(command: Command) -> tuple[str, ...]:
    """What one documented command is checked with (commands checked alike share one run)."""
    words = command.words
    if words[0] == "snakemake":
        checked = _check_argv(words)
        return ("snakemake", *checked[0]) if checked else ()
    if words[0] in ("python", "python3") and len(words) > 1:
        target = list(words[1:3]) if words[1] == "-m" else [words[1]]
        return ("python", *target, "--help")
    if words[0] == "make":
        return ("make", "-n", *(w for w in words[1:] if "=" not in w and w != PLACEHOLDER))
    return ()


def _run(line: tuple[str, ...], template: Path, workdir: Path) -> subprocess.CompletedProcess:
    shutil.copytree(template, workdir, symlinks=True)
    for name, text in READERS_FILES.items():
        (workdir / name).write_text(text)
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        **OFFLINE,
        "HF_HOME": str(workdir / ".hf-home"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(workdir / "src"),
    }
    if line[0] == "snakemake":
        cmd = [*SNAKEMAKE, *line[1:]]
    elif line[0] == "python":
        cmd = [sys.executable, *line[1:]]
    else:
        cmd = list(line)
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


# Outside a git checkout: what not to copy (.gitignore's run outputs and environments).
NOT_COPIED = (".git", ".venv", "venv", "results", ".snakemake", "__pycache__", "*.egg-info", "logs")


def _working_tree_copy(dest: Path) -> Path:
    """The files a commit would hold now (tracked and untracked, not ignored ones)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
    )
    if listed.returncode != 0:  # not a git checkout (an unpacked archive)
        shutil.copytree(REPO, dest, symlinks=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
        return dest
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name, follow_symlinks=False)
    return dest


@pytest.fixture(scope="module")
def checked(request, tmp_path_factory) -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """Every distinct check line of the selected commands (all, unless `-k` chose some) run
    once, in parallel, each in its own copy of the tree."""
    root = tmp_path_factory.mktemp("documented-commands")
    template = _working_tree_copy(root / "template")
    selected = [
        item.callspec.params["command"]
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and "command" in getattr(getattr(item, "callspec", None), "params", {})
    ]
    lines = sorted({line for c in selected or COMMANDS if (line := _check_line(c))})
    workers = max(2, min(8, os.cpu_count() or 2))
    with ThreadPoolExecutor(workers) as pool:
        done = pool.map(lambda i: _run(lines[i], template, root / f"run-{i}"), range(len(lines)))
        return dict(zip(lines, done, strict=True))


def test_docs_show_the_commands_this_test_checks():
    """The extraction found the commands: a test that checks nothing cannot fail."""
    firsts = {c.words[0] for c in COMMANDS}
    assert {"snakemake", "make", "python"} <= firsts
    snakemake = [c for c in COMMANDS if c.words[0] == "snakemake"]
    assert len(snakemake) >= 10
    docs = {c.doc for c in snakemake}
    assert {"README.md", "docs/csd3.md"} <= docs
    assert any("--profile" in c.words for c in snakemake)
    assert any("--report" in c.words for c in snakemake)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.id)
def test_documented_command_works(command: Command, checked):
    words = command.words
    assert words[0] in {"snakemake", "make", "python", "python3"} | EXTERNAL, (
        f"{command.id}: `{words[0]}` is neither checked here nor listed in EXTERNAL"
    )
    for word in words[1:]:
        path = word.split("=", 1)[-1]
        if path.startswith(REPO_DIRS) and PLACEHOLDER not in path:
            assert (REPO / path).exists(), f"{command.id}: {path} does not exist"
    if words[0] in EXTERNAL:
        return
    if words[0] == "snakemake":
        args = _snakemake_args(words)
        assert args is not None, f"{command.id}: Snakemake's argument parser rejects it"
    line = _check_line(command)
    assert line, f"{command.id}: no command to check"
    done = checked[line]
    output = done.stdout + done.stderr
    if words[0] == "snakemake":
        for configfile in args.configfile or []:
            name = str(configfile)
            assert name in READERS_FILES or (REPO / name).is_file(), (
                f"{command.id}: --configfile reads {name!r} as a config file: it takes every "
                "word up to the next option, so write targets first "
                "(snakemake TARGET --configfile FILE)"
            )
        if args.report:
            assert Path(args.report).suffix in (".html", ".zip"), command.id
        expected = _check_argv(words)[1]
        assert done.returncode == 0, f"{command.id}\n$ {' '.join(line)}\n{output[-3000:]}"
        assert expected in output, f"{command.id}: no {expected!r} in\n{output[-3000:]}"
        if expected.startswith("This was a dry-run"):
            for target in args.targets:
                assert re.search(rf"(?m)^{re.escape(str(target))}\s+\d+$", output) or (
                    str(target) in output and "/" in str(target)
                ), f"{command.id}: target {target} is not in the dry run's jobs\n{output[-3000:]}"
    elif words[0] in ("python", "python3"):
        script = words[2] if words[1] == "-m" else words[1]
        if words[1] != "-m":
            assert (REPO / script).is_file(), f"{command.id}: {script} does not exist"
        assert done.returncode == 0, f"{command.id}: --help failed\n{output[-3000:]}"
        for word in words[2:]:
            option = word.split("=", 1)[0]
            if option.startswith("--"):
                assert re.search(rf"{re.escape(option)}(?![\w-])", done.stdout), (
                    f"{command.id}: {script} --help does not list {option}"
                )
    else:  # make
        assert done.returncode == 0, f"{command.id}: make -n failed\n{output[-3000:]}"
        makefile = (REPO / "Makefile").read_text()
        for word in words[1:]:
            if "=" in word:
                var = word.split("=", 1)[0]
                assert re.search(rf"(?m)^{var}\s*[?:+]?=", makefile), (
                    f"{command.id}: the Makefile does not use {var}"
                )
