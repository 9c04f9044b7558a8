#!/usr/bin/env python
"""Fault injection: kill the pipeline anywhere, resume, and check the results are the same.

1. Reference: the DAG, uninterrupted, on a reduced config (.test/config/small.yaml), or a
   finished run of it given with --reference (the test suite passes its shared small run).
2. Kills: the same DAG in a fresh directory, started with CIRCUITFLOW_INJECT_OOM naming every GPU
   stage (one CUDA-style out-of-memory error in one batch of each: the stage must halve its batch
   and finish). While it runs, the whole Snakemake process group is killed with SIGKILL at each
   kill point in turn, found by polling the run's files (a capture .partial file, an SAE
   checkpoint, the attribution and interventions logs); after each kill the user's recovery is
   run: `snakemake --unlock`, then the same command with `--rerun-incomplete`. At the end
   `scripts/compare_runs.py` compares the outputs with the reference (exit 0: same conclusions),
   every SAE killed after a checkpoint must say `"resumed": true`, and every injected OOM must
   have been logged as a halving in a job that finished.
3. Full disk (root, Linux: a small tmpfs mounted as outdir; skipped with the reason otherwise):
   the run must stop with a one-line error (its planned files do not fit, before any job, or
   "no space left on device" from the writer), then go on after the mount is enlarged: the same
   command finishes with the reference's results, or, refused before any job, its dry run goes.

Writes benchmarks/results/faults.json: kills, kills_survived, ooms, ooms_survived,
outputs_identical and the details. Run by tests/workflow/test_faults.py (slow).

    python benchmarks/faults.py [--workdir DIR] [--out benchmarks/results/faults.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".test" / "config" / "small.yaml"
OOM_STAGES = ("capture", "train_sae", "attribution", "interventions")
TIMEOUT = 900  # seconds any one Snakemake run may take
# What compare_runs reads: the pipeline up to interventions (the report and provenance rules add
# minutes of job start-up and no result).
TARGET_GLOBS = ("baseline/{b}.json", "saes/{s}/layer_{l}", "interventions/{b}/summary.json")


def targets(config: dict, results: Path) -> list[str]:
    from circuitflow import config as cf

    resolved = cf.resolve(config, REPO)
    out = []
    for pattern in TARGET_GLOBS:
        for b in sorted(resolved["behaviours"]):
            for s in resolved["sites"]:
                for layer in resolved["layers"]:
                    out.append(str(results / pattern.format(b=b, s=s, l=layer)))
    return sorted(set(out))


def snakemake_cmd(workdir: Path, config_file: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config_file),
        "--cores",
        "2",
        *args,
    ]


def environment(extra: dict | None = None) -> dict:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1", **(extra or {})}


class Run:
    """One pipeline: its directory, config file and the Snakemake command that makes it."""

    def __init__(self, workdir: Path, config: dict, env: dict | None = None):
        self.workdir = workdir
        self.results = workdir / "results"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_file = workdir / "config.yaml"
        self.config_file.write_text(yaml.safe_dump({**config, "outdir": str(self.results)}))
        self.targets = targets(config, self.results)
        self.env = environment(env)
        self.log = workdir / "snakemake.log"
        self.attempts = 0

    def start(self, *args: str) -> subprocess.Popen:
        self.attempts += 1
        with open(self.log, "a") as log:
            log.write(f"\n===== attempt {self.attempts}: {' '.join(args)}\n")
        cmd = snakemake_cmd(self.workdir, self.config_file, *args, *self.targets)
        # Its own session and process group: killpg reaches Snakemake and every job it started.
        return subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=self.env,
            stdout=open(self.log, "a"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def run(self, *args: str) -> int:
        proc = self.start(*args)
        try:
            return proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return 124

    def unlock(self) -> int:
        cmd = snakemake_cmd(self.workdir, self.config_file, "--unlock")
        return subprocess.run(cmd, cwd=self.workdir, env=self.env, capture_output=True).returncode

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text().splitlines()[-n:]) if self.log.exists() else ""


# --- kill points: (name, stage, condition on the results directory) -------------------------------
def partial_capture(r: Path) -> bool:
    """Capture has flushed at least one checkpoint unit to a .partial file."""
    return any(p.stat().st_size > 64 << 10 for p in r.glob("activations/*/*.h5.partial"))


def sae_checkpoint(r: Path) -> bool:
    return any(r.glob("checkpoints/saes/*/*/step_*/state.json"))


def log_started(rel: str) -> Callable[[Path], bool]:
    def started(r: Path) -> bool:
        log = r / rel
        return log.is_file() and log.stat().st_size > 0

    return started


def kill_points(behaviour: str) -> list[tuple[str, str, Callable[[Path], bool]]]:
    return [
        ("model training started", "train_model", log_started("logs/train_model.log")),
        ("capture after a flushed unit", "capture", partial_capture),
        ("train_sae after a checkpoint", "train_sae", sae_checkpoint),
        ("attribution started", "attribution", log_started(f"logs/attribution/{behaviour}.log")),
        (
            "interventions started",
            "interventions",
            log_started(f"logs/interventions/{behaviour}.log"),
        ),
    ]


def kill_when(run: Run, condition: Callable[[Path], bool], args: tuple[str, ...]) -> dict:
    """Start `run`; SIGKILL its process group as soon as `condition` holds. Returns what
    happened: killed (the condition was met in time), or the exit status if it ended first."""
    proc = run.start(*args)
    t0 = time.perf_counter()
    while proc.poll() is None:
        if condition(run.results):
            seen = {
                "checkpoints": sorted(
                    str(p.parent.relative_to(run.results))
                    for p in run.results.glob("checkpoints/saes/*/*/step_*")
                )
            }
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"killed": True, "after_s": round(time.perf_counter() - t0, 1), **seen}
        if time.perf_counter() - t0 > TIMEOUT:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"killed": False, "status": "timeout"}
        time.sleep(0.05)
    return {"killed": False, "status": proc.returncode}


def compare(a: Path, b: Path) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(a), str(b)],
        capture_output=True,
        text=True,
        env=environment(),
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def oom_outcomes(results: Path) -> dict[str, bool]:
    """Per GPU stage: did its (last) job log a halved batch and finish?"""
    logs = {
        "capture": [results / "logs/capture.log"],
        "train_sae": sorted(results.glob("logs/train_sae/*.log")),
        "attribution": sorted(results.glob("logs/attribution/*.log")),
        "interventions": sorted(results.glob("logs/interventions/*.log")),
    }
    out = {}
    for stage, paths in logs.items():
        texts = [p.read_text() for p in paths if p.is_file()]
        out[stage] = bool(texts) and all(
            f"{stage}: out of memory: batch size halved" in t for t in texts
        )
    return out


def kills_and_ooms(base: dict, workdir: Path, reference: Path) -> dict:
    behaviour = sorted(base["behaviours"])[0]
    inject = ",".join(OOM_STAGES)
    run = Run(workdir / "killed", base, {"CIRCUITFLOW_INJECT_OOM": inject})
    events, resumed_saes = [], set()
    args: tuple[str, ...] = ()
    for name, stage, condition in kill_points(behaviour):
        event = {"point": name, "stage": stage, **kill_when(run, condition, args)}
        if event["killed"]:
            resumed_saes |= set(event.get("checkpoints", []))
            event["unlock_status"] = run.unlock()
        events.append(event)
        print(f"kill point {name!r}: {event}", flush=True)
        args = ("--rerun-incomplete",)
    final = run.run(*args)
    made = [e for e in events if e["killed"]]
    status, diff = compare(run.results, reference) if final == 0 else (None, run.tail())
    resumed = {}
    for sae in sorted(resumed_saes):  # checkpoints/saes/{site}/layer_N
        metrics = run.results / Path(sae).relative_to("checkpoints") / "metrics.json"
        resumed[sae] = metrics.is_file() and json.loads(metrics.read_text())["resumed"] is True
    ooms = oom_outcomes(run.results) if final == 0 else dict.fromkeys(OOM_STAGES, False)
    identical = status == 0
    return {
        "kills": len(made),
        # A kill is survived when the recovery (unlock, same command) ran to the end with the
        # uninterrupted run's conclusions.
        "kills_survived": len(made) if final == 0 and identical and all(resumed.values()) else 0,
        "kill_events": events,
        "final_status": final,
        "snakemake_attempts": run.attempts,
        "saes_resumed": resumed,
        "ooms": len(OOM_STAGES),
        "ooms_survived": sum(ooms.values()),
        "oom_stages": ooms,
        "outputs_identical": identical,
        "compare_runs": diff,
    }


# --- full disk ------------------------------------------------------------------------------------
def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def mount_tmpfs(where: Path, size: int) -> str | None:
    """Mount a tmpfs of `size` bytes on `where`; the reason why not, or None when mounted."""
    if sys.platform != "linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"mount failed: {done.stderr.strip()}"


def planned_disk(run) -> int:
    """The files the fit check holds against the free disk (circuitflow.fit.held_plan)."""
    from circuitflow import config as cf_config
    from circuitflow import fit

    config = cf_config.resolve(yaml.safe_load(run.config_file.read_text()))
    return sum(fit.held_plan(config).values())


def full_disk(base: dict, workdir: Path, reference: Path) -> dict:
    """outdir on a tmpfs that holds everything before the activation files and a quarter of them:
    the run must stop in one line, before any job (its planned files do not fit:
    circuitflow.fit) or in the writer that finds the disk full; after the mount grows, the same
    command goes on. Stopped in a writer, it must finish with the reference's results; refused
    before any job, nothing was written to resume, so its dry run must go (a fresh run of the
    config is what the kills experiment compares with the reference already)."""
    acts = du(reference / "activations")
    before = sum(
        du(reference / d)
        for d in ("model", "prompts", "baseline", "logs", "benchmarks", "provenance")
        if (reference / d).exists()
    )
    size = before + acts // 4
    run = Run(workdir / "disk", base)
    reason = mount_tmpfs(run.results, size)
    if reason:
        print(f"full disk: skipped ({reason})", flush=True)
        return {"skipped": reason}
    try:
        first = run.run()
        errors = []
        for log in run.results.glob("logs/**/*.log"):
            errors += [ln for ln in log.read_text().splitlines() if "no space left on device" in ln]
        # Or refused before any job: the run's planned files do not fit (circuitflow.fit).
        refused = [ln for ln in run.tail(200).splitlines() if ln.startswith("config error:")]
        errors += refused
        before_any_job = bool(refused) and not any(run.results.glob("benchmarks/**/*.tsv"))
        room = max(4 * du(reference), planned_disk(run)) + (64 << 20)
        remount = subprocess.run(
            ["mount", "-o", f"remount,size={room}", str(run.results)],
            capture_output=True,
            text=True,
        )
        run.unlock()
        if before_any_job:
            second, status, diff = run.run("-n"), None, None
        else:
            second = run.run("--rerun-incomplete")
            status, diff = compare(run.results, reference) if second == 0 else (None, run.tail())
        result = {
            "tmpfs_bytes": size,
            "first_status": first,
            "error_lines": errors,
            "clear_error": first != 0 and len(errors) >= 1,
            "refused_before_any_job": before_any_job,
            "remount_status": remount.returncode,
            "resumed_status": second,
            "outputs_identical": None if before_any_job else status == 0,
            "compare_runs": diff,
        }
    finally:
        subprocess.run(["umount", "-l", str(run.results)], capture_output=True)
    print(f"full disk: {result}", flush=True)
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--workdir", type=Path, help="kept afterwards (default: a temporary one)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "faults.json")
    p.add_argument("--no-disk", action="store_true", help="skip the full-disk experiment")
    p.add_argument(
        "--reference", type=Path, help="results of an uninterrupted run of --config to reuse"
    )
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    base = yaml.safe_load(args.config.read_text())
    base.pop("outdir", None)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="circuitflow-faults-"))
    t0 = time.perf_counter()
    if args.reference:
        reference = args.reference
    else:
        run = Run(workdir / "reference", base)
        status = run.run()
        if status != 0:
            raise SystemExit(f"the uninterrupted run failed ({status}):\n{run.tail()}")
        reference = run.results
        print(f"reference run: {time.perf_counter() - t0:.0f} s", flush=True)
    result = kills_and_ooms(base, workdir, reference)
    result["full_disk"] = (
        {"skipped": "--no-disk"} if args.no_disk else full_disk(base, workdir, reference)
    )
    result["config"] = str(args.config.relative_to(REPO))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"kills survived {result['kills_survived']}/{result['kills']}, OOMs survived "
        f"{result['ooms_survived']}/{result['ooms']}, outputs identical: "
        f"{result['outputs_identical']} -> {args.out}"
    )
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
