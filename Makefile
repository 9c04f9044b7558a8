# Two-command quick start: `make run` (install + pipeline on the embedded default) and
# `make test` (install + test suite). Both create the virtual environment in $(VENV) on first use.

PYTHON ?= python3
VENV ?= .venv
# A pinned torch first: an unpinned one pulls several GB of CUDA wheels on a CPU-only machine.
# On a GPU machine set TORCH to the build that matches its CUDA, e.g. TORCH='torch==2.13.0'.
TORCH ?= torch==2.13.0
CORES ?= all
# Test workers (pytest-xdist): four on 2 cores. Each shared run holds a worker (xdist adds work
# to a worker only when its queue is almost empty), the other two take the rest, and whole-DAG
# runs and the local Slurm cluster leave cores idle while they wait.
TEST_WORKERS ?= 4
# make bench-gpu: the measurement's options, and where the wheels go on a machine without network.
MEASURE ?= --device cuda
SITE ?= /tmp/circuitflow-site
ARCHIVE ?=
MEASURE_ARCHIVE = $(if $(ARCHIVE),--archive $(ARCHIVE))
BIN := $(VENV)/bin
ACTIVATE := PATH="$(abspath $(BIN)):$$PATH" VIRTUAL_ENV="$(abspath $(VENV))"

.PHONY: install run test lint format clean report check bench-gpu

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

run: install
	$(ACTIVATE) snakemake --cores $(CORES)

report: install
	$(ACTIVATE) snakemake --cores $(CORES)
	$(ACTIVATE) snakemake --report results/report.html

check: install
	$(ACTIVATE) snakemake --cores 1 check

test: install
	$(ACTIVATE) pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

# Every benchmark on this machine's GPU within 8 minutes (benchmarks/measure.py): the results
# land in benchmarks/results/*-cuda.json (ARCHIVE=FILE also packs them and each step's log into
# FILE). Where .whl/ exists and PyPI does not answer (a lent GPU machine, docs/csd3.md), the
# wheels benchmarks/device_wheels.py fetched go into $(SITE) for the machine's own $(PYTHON) and
# its torch; elsewhere the venv. `--device cpu` is its smoke test (tests/test_measure.py).
# `make install`, not $(MAKE): make -n runs a line naming $(MAKE), and this one measures.
bench-gpu:
	@if [ -d .whl ] && ! $(PYTHON) benchmarks/device_wheels.py online; then \
		echo "bench-gpu: no network: the wheels in .whl/ into $(SITE)"; \
		$(PYTHON) benchmarks/device_wheels.py install --target $(SITE) || exit 1; \
		PYTHONPATH="$(SITE)" $(PYTHON) benchmarks/device_wheels.py check \
			|| echo "bench-gpu: measuring anyway; the steps report what fails"; \
		PYTHONPATH="$(SITE)" $(PYTHON) benchmarks/measure.py $(MEASURE) $(MEASURE_ARCHIVE); \
	else \
		make install && $(ACTIVATE) python benchmarks/measure.py $(MEASURE) $(MEASURE_ARCHIVE); \
	fi

# lint-imports checks the floors (pyproject.toml) of this checkout's src/, whatever the venv has
# installed (worktrees may share one).
lint: install
	$(ACTIVATE) ruff check src scripts tests benchmarks .test
	$(ACTIVATE) ruff format --check src scripts tests benchmarks .test
	$(ACTIVATE) PYTHONPATH="$(abspath src)" lint-imports
	$(ACTIVATE) snakefmt --check Snakefile workflow
	$(ACTIVATE) snakemake --lint

format: install
	$(ACTIVATE) ruff check --fix src scripts tests benchmarks .test
	$(ACTIVATE) ruff format src scripts tests benchmarks .test
	$(ACTIVATE) snakefmt Snakefile workflow

clean:
	rm -rf results .snakemake
