"""Fixtures shared by every test folder: the runs of the real DAG that whole-DAG tests share
(each computed once per session), and the tiny local Hugging Face model.

Test folders mirror the package (tests/<stage>/ for src/circuitflow/<stage>/); tests/workflow/
holds the whole-DAG tests, all marked `slow`. Helpers live in tests/helpers/.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers.dag import REPO, load_test_config, run_snakemake

# One OpenMP thread a test process (and the processes tests start, which inherit it), set
# before any test module imports torch: `make test` runs four workers on two cores, where a
# many-threaded region spins on cores another worker needs. Pipeline jobs get their own count
# from the rules (common.smk's stage()).
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# Whole-DAG runs each test session shares (fixture -> pytest-xdist group). `make test` runs four
# workers with --dist loadgroup: the tests that read one run go to one worker, which computes
# it first (the run's group is handed out first).
SHARED_RUNS = {
    "default_results": "default-run",
    "small_results": "small-run",
    "local_hf_results": "local-hf-run",
    "published_results": "published-run",
}
# Modules that read a shared run from a second group, handed out right after the runs and the
# longest test: its worker waits for the run (computed once, by whichever worker asks first:
# shared_run), then runs them beside the first group's tests instead of after them. Handed out
# last, the default run's late group ended up behind its first group (19:21 on 2 cores).
LATE_READERS = {
    "tests/workflow/test_report_dag.py": "default-run-late",
    "tests/workflow/test_graph_page.py": "default-run-late",
    "tests/workflow/test_prompt_graph_science.py": "default-run-late",
    "tests/workflow/test_interventions_science.py": "default-run-late",
    "tests/workflow/test_transcoder_dag.py": "default-run-late",
    "tests/workflow/test_faults.py": "small-run-late",
    "tests/workflow/test_bfloat16.py": "small-run-late",
}
LATE_GROUPS = set(LATE_READERS.values())
# Shared like the runs (one xdist group, computed once a session), handed out with the other
# groups: benchmarks/measure.py's CPU mode, whose GPU-suite step is also the suite's small run
# that tests/report/test_gpu_hours.py checks.
SHARED_LATER = {"measure_cpu": "measure-cpu"}


# The longest test outside the shared runs' groups (about 8 minutes on 2 cores): it starts right
# after the groups, not after the ~250 unit tests that come before it alphabetically.
LONGEST = ("tests/workflow/test_slurm.py::test_pipeline_on_local_slurm_and_walltime_resume",)


def _groups(item) -> set[str]:
    """The xdist groups `item` is marked with (pytest_itemcollected marks them)."""
    return {m.args[0] for m in item.iter_markers("xdist_group")}


def pytest_collection_modifyitems(config, items):
    """Longest work first: `make test` runs xdist with --no-loadscope-reorder, which hands out
    the tests in this order, so the shared runs, the longest test and the shared runs' late
    readers start at once and the unit tests fill the workers' gaps."""

    def rank(item) -> int:
        groups = _groups(item)
        for i, group in enumerate(SHARED_RUNS.values()):
            if group in groups:
                return i
        if item.nodeid.startswith(LONGEST):
            return len(SHARED_RUNS)
        if groups & LATE_GROUPS:
            return len(SHARED_RUNS) + 1
        if groups or item.get_closest_marker("slow"):
            return len(SHARED_RUNS) + 2
        return len(SHARED_RUNS) + 3

    items.sort(key=rank)  # stable: collection order within a rank


def pytest_itemcollected(item):
    """One xdist group per test (xdist joins several into a new one): a shared run's (or its
    late readers'), else its module's when it uses a module-scoped fixture. A worker computes
    such a fixture once for the tests it runs, so a module spread over workers computed it on
    each: the GPU suite at small sizes (150 s) and the memory probes (180 s) ran twice a
    session."""
    # Marked as each test is collected: xdist reads the groups in its own
    # pytest_collection_modifyitems, which may run before this conftest's.
    names = getattr(item, "fixturenames", ())
    module = item.nodeid.split("::")[0]
    for fixture, group in (SHARED_RUNS | SHARED_LATER).items():
        if fixture in names:
            item.add_marker(pytest.mark.xdist_group(LATE_READERS.get(module, group)))
            return
    defs = getattr(item, "_fixtureinfo", None)
    defs = defs.name2fixturedefs if defs else {}
    if any(d and d[-1].scope == "module" for d in (defs.get(n) for n in names)):
        item.add_marker(pytest.mark.xdist_group(module))


# CIRCUITFLOW_TEST_CPU=<file>: each test phase's CPU seconds (this worker's and those of the
# processes it waited for: Snakemake and its jobs, forked ones too) appended to <file>, one JSON
# line a phase (summed by benchmarks/suite_cpu.py). --durations gives wall time, which on a loaded
# machine says more about the neighbours than about the test; CPU says what a test costs the
# suite.
CPU_LOG = os.environ.get("CIRCUITFLOW_TEST_CPU")


def _cpu_seconds() -> float:
    import resource

    from helpers.dag import prefork_cpu_seconds

    own, waited = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    # Jobs forked from the warm interpreter (helpers.dag.prefork_socket) are its children.
    forked = prefork_cpu_seconds()
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime + forked


# The default run is the suite's longest chain (train_model alone is two minutes of one core),
# and its late readers wait for it: on 2 cores with four workers it got about half a core
# (707 s of wall for 516 CPU-s) and the suite ended with cores idle behind its readers. So each
# worker lowers its own priority (UNIT_NICE) from its first test outside the default run's
# group on; the worker that computes the default run does so at the niceness it started with,
# and the other whole-DAG runs stay below it (helpers.dag.NICE on top of this).
UNIT_NICE = 5
_NICED: list[bool] = []


def _lower_priority_unless_default_run(item) -> None:
    if not _NICED and SHARED_RUNS["default_results"] not in _groups(item):
        os.nice(UNIT_NICE)
        _NICED.append(True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one process alone has no one to make room for
        _lower_priority_unless_default_run(item)
    if CPU_LOG:
        yield from _logged(item, "setup")
    else:
        yield


if CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        yield from _logged(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item):
        yield from _logged(item, "teardown")


def _logged(item, when: str):
    import json
    import time

    cpu, wall, start = _cpu_seconds(), time.monotonic(), time.time()
    yield
    line = {"test": item.nodeid, "when": when, "cpu_s": round(_cpu_seconds() - cpu, 2),
            "wall_s": round(time.monotonic() - wall, 2), "start": round(start, 1),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "master")}  # fmt: skip
    with open(CPU_LOG, "a") as f:  # one short write a line: workers append safely
        f.write(json.dumps(line) + "\n")


def shared_run(name: str, tmp_path_factory, worker_id: str, run: Callable[[Path], None]) -> Path:
    """`run(workdir)` once per test session, whichever xdist worker asks first; the others
    wait for it (a lock in the session's temporary root, which every worker shares) and read
    the same results. A failed run is not retried by the next worker: it fails at once."""
    if worker_id == "master":  # no xdist: this process is the session
        workdir = tmp_path_factory.mktemp(name)
        run(workdir)
        return workdir / "results"
    root = tmp_path_factory.getbasetemp().parent
    workdir, done, failed = root / name, root / f"{name}.done", root / f"{name}.failed"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if failed.exists():
            pytest.fail(f"the shared {name} failed in another worker:\n{failed.read_text()}")
        if not done.exists():
            try:
                workdir.mkdir()
                run(workdir)
            except BaseException as e:
                failed.write_text(f"{type(e).__name__}: {e}"[-5000:])
                raise
            done.touch()
    return workdir / "results"


@pytest.fixture(scope="session")
def tiny_hf_model_dir() -> Path:
    """A GPT-2-architecture Hugging Face model with random weights and its own BPE tokenizer
    (.test/tiny-gpt2, made by .test/make_tiny_gpt2.py): no download."""
    return REPO / ".test" / "tiny-gpt2"


@pytest.fixture(scope="session")
def tl_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """TransformerLens checkpoint directories of each shape in helpers.tl_checkpoints.SHAPES
    (with LayerNorm, without, attention-only), a previous-token head planted in each, built
    once a session; the one without LayerNorm saved without TransformerLens's buffers."""
    from helpers import tl_checkpoints

    root = tmp_path_factory.mktemp("tl-checkpoints")
    return {
        shape: tl_checkpoints.save(tl_checkpoints.build(shape), root / shape, shape != "no_ln")
        for shape in tl_checkpoints.SHAPES
    }


@pytest.fixture(scope="session")
def default_results(tmp_path_factory, worker_id) -> Path:
    """The whole DAG on the embedded default config (config/config.yaml), once per test session.
    Tests of the science (accuracy, circuits, SAE quality) and of the report read its outputs.
    CIRCUITFLOW_DEFAULT_RESULTS=<results dir of a default run> reuses one instead (development)."""
    reuse = os.environ.get("CIRCUITFLOW_DEFAULT_RESULTS")
    if reuse:
        return Path(reuse)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config.pop("outdir")  # results go to this test's directory, not the checkout's results/
    return shared_run("default-run", tmp_path_factory, worker_id,
                      lambda workdir: run_snakemake(config, workdir, nice=0))  # fmt: skip


@pytest.fixture(scope="session")
def small_results(tmp_path_factory, worker_id) -> Path:
    """The whole DAG on .test/config/small.yaml (one behaviour, one layer), once per session.
    CIRCUITFLOW_SMALL_RESULTS=<results dir of a small run> reuses one instead (development)."""
    reuse = os.environ.get("CIRCUITFLOW_SMALL_RESULTS")
    if reuse:
        return Path(reuse)
    config = load_test_config("small")
    return shared_run("small-run", tmp_path_factory, worker_id,
                      lambda w: run_snakemake(config, w, nice=0, prefork=True))  # fmt: skip


@pytest.fixture(scope="session")
def local_hf_results(tiny_hf_model_dir, tmp_path_factory, worker_id) -> Path:
    """The DAG up to capture on the tiny local Hugging Face model (tiny_hf_model_dir), hub
    offline, from a local text corpus: prefetch_model (a localrule), two behaviours' prompts and
    baselines, and a capture of two sites and layers in two shards, merged. Once per session:
    tests/model/test_model_loading.py reads the model path, tests/workflow/test_capture_shards.py
    the shards. Snakemake's output is kept in snakemake.log beside the results."""
    from circuitflow.prompts import CAPITALS, IOI_TEMPLATES

    def run(workdir: Path) -> None:
        corpus = workdir / "corpus.txt"
        lines = [t.replace("{A}", "Mary").replace("{B}", "John") for t in IOI_TEMPLATES]
        lines += [f"The capital of {c} is the city of {k}" for c, k in CAPITALS.items()]
        corpus.write_text("\n".join(lines * 40) + "\n")
        config = {
            "model": {"name": str(tiny_hf_model_dir)},
            "behaviours": {
                "ioi": {"source": "ioi", "n_prompts": 16},
                "capitals": {"source": "factual_recall", "n_prompts": 16},
            },
            "sites": ["resid_post", "mlp_out"],
            # 100 contexts of 31 rows (BOS left out) in checkpoint units of 20: two shards.
            "capture": {"corpus": str(corpus), "n_tokens": 3100, "context_length": 32,
                        "shards": 2, "checkpoint_tokens": 620, "dtype": "float32"},
        }  # fmt: skip
        results = workdir / "results"
        targets = [results / "baseline" / f"{b}.json" for b in ("ioi", "capitals")]
        targets += [
            results / "activations" / site / f"layer_{layer}.h5"
            for site in ("resid_post", "mlp_out")
            for layer in (0, 1)
        ]
        done = run_snakemake(config, workdir, *map(str, targets), prefork=True)
        (workdir / "snakemake.log").write_text(done.stdout + done.stderr)

    return shared_run("local-hf-run", tmp_path_factory, worker_id, run)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, worker_id) -> Path:
    """A Qwen3-architecture Hugging Face model with random weights (2 layers, d_model 32, norms'
    weights away from one) and the tiny GPT-2's tokenizer, made once per session
    (helpers.published_transcoders.make_tiny_qwen3): no download."""
    from helpers.published_transcoders import make_tiny_qwen3

    made = shared_run("tiny-qwen3", tmp_path_factory, worker_id, lambda w: make_tiny_qwen3(w))
    return made.parent / "google" / "tiny-qwen3"


@pytest.fixture(scope="session")
def published_results(tiny_qwen3_dir, tmp_path_factory, worker_id) -> Path:
    """The DAG to per-prompt graphs on circuit-tracer's transcoders (a mwhanna_transcoder
    release's local copy, built for the tiny Qwen3: helpers.published_transcoders), hub
    offline, once per session: prefetch_model, the prompts, the token set, one
    pretrained_sae job for both layers, the features, the replacement score and the graphs.
    Snakemake's output is kept in snakemake.log beside the results; the release beside them."""
    from helpers.published_transcoders import (
        D_SAE,
        lay_out_mwhanna,
        published_config,
        transcoder_weights,
    )

    def run(workdir: Path) -> None:
        weights = {layer: transcoder_weights(32, D_SAE, layer, skip=False) for layer in (0, 1)}
        release = lay_out_mwhanna(workdir / "release", tiny_qwen3_dir, weights)
        results = workdir / "results"
        targets = [results / "attribution" / "ioi" / name
                   for name in ("prompt_graphs", "prompt_graphs.html")]  # fmt: skip
        targets.append(results / "saes" / "replacement.json")
        config = published_config(tiny_qwen3_dir, release)
        done = run_snakemake(config, workdir, *map(str, targets), env={"HF_HUB_OFFLINE": "1"},
                             prefork=True)  # fmt: skip
        (workdir / "snakemake.log").write_text(done.stdout + done.stderr)

    return shared_run("published-run", tmp_path_factory, worker_id, run)


@pytest.fixture(scope="session")
def measure_cpu(tmp_path_factory, worker_id) -> Path:
    """benchmarks/measure.py's CPU mode (every step at smoke sizes), once per session. Its
    folder: results/ (each step's JSON), logs/ (each step's output), screen.txt (what it
    printed) and status (its exit status)."""

    def run(workdir: Path) -> None:
        # A generous budget: the suite's workers share the cores (alone it takes ~85 s on 2).
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "measure.py"), "--device", "cpu",
             "--out-dir", str(workdir / "results"), "--log-dir", str(workdir / "logs"),
             "--budget", "1800"],
            capture_output=True, text=True, cwd=REPO, timeout=2000,
        )  # fmt: skip
        (workdir / "screen.txt").write_text(done.stdout + done.stderr)
        (workdir / "status").write_text(str(done.returncode))

    return shared_run("measure-cpu", tmp_path_factory, worker_id, run).parent


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, worker_id) -> Path:
    """A results directory holding only the embedded model at .test/config/tiny.yaml's settings,
    trained once per session: the tiny-config DAG tests place it in their runs
    (helpers.dag.place_model) instead of each training the same model."""

    def run(workdir: Path) -> None:
        run_snakemake(load_test_config("tiny"), workdir,
                      str(workdir / "results" / "model" / "model.json"), prefork=True)  # fmt: skip

    return shared_run("tiny-model", tmp_path_factory, worker_id, run)
