"""A job's process before its work: the interpreter and the libraries its script imports
(measured per kind of job), the CUDA runtime's host share on a GPU, and a real model's
conversion copies when it loads. The rule table (circuitflow.resources) adds each job's work.

Every stage script imports circuitflow.config (yaml) and torch (numpy): `base`, torch named
because circuitflow.config no longer imports it (planning stays light); the report's jobs
import no torch (its import is seconds of CPU a job; tests/workflow/test_light_jobs.py checks
the real jobs): those that draw figures pandas, matplotlib and pyarrow (`report`), the pages
and tables alone pandas and pyarrow (`pages`); the model stages add
TransformerLens and SAELens (transformers, datasets, h5py): `model`; a job that imports
circuitflow.config and the standard library alone (provenance_run): `config`; the embedded
model's token sets without torch (held_out_tokens): `arrays`; its prompts, which read its
tokenizer with transformers but need no torch: `tokenizer` (37 and 178 MiB in a fresh install;
CI measured those jobs' whole peaks at 44 and 194 MiB). Measured as the
resident set after importing RUNTIME_MODULES in a fresh interpreter (`python
scripts/runtime_memory.py` re-measures; tests/test_memory_accuracy.py checks these against it),
torch 2.13 CPU wheel, Linux x86-64, MiB, in a fresh install. The same imports measure about 20%
less where the libraries' files have aged in the page cache (220 against 272 MiB for `base` on
one machine, 134 against 178 for `tokenizer`: fresh files are mapped whole on first touch), so
these are the upper values.
"""

from __future__ import annotations

from circuitflow.memory.probes import MiB

FIGURES = ("circuitflow.config", "pandas", "matplotlib.pyplot", "pyarrow.parquet")
RUNTIME_MODULES = {
    "config": ("circuitflow.config",),
    "arrays": ("circuitflow.config", "numpy", "circuitflow.io"),  # token sets without torch
    "tokenizer": ("circuitflow.config", "pandas", "pyarrow.parquet",
                  "transformers.tokenization_utils_fast"),  # the embedded model's prompts
    "base": ("circuitflow.config", "torch"),
    "pages": ("circuitflow.config", "pandas", "pyarrow.parquet"),  # pages and tables alone
    "report": FIGURES,
    # job_costs: the same libraries; its figure of every job's costs peaks higher (measured
    # 191 MiB in the default run, against 175 for the report's other figures), as do the
    # figures across behaviours (interventions_across: 177, 204 in CI) and dictionaries
    # (sae_summary: 171).
    "costs": FIGURES,
    "model": ("circuitflow.config", "torch", "transformer_lens", "sae_lens", "h5py", "pandas",
              "matplotlib.pyplot", "pyarrow.parquet"),
}  # fmt: skip
# pages and report: fresh installs measured 146 and 158-177 MiB (CI; this machine), an aged
# one 108 and 137.
RUNTIME_MB = {"config": 16, "arrays": 39, "tokenizer": 180, "base": 272, "pages": 145,
              "report": 175, "costs": 190, "model": 625}  # fmt: skip
# A job on a GPU also maps the CUDA runtime, cuBLAS and cuDNN into its host memory (and their
# lazily loaded kernels). Not measured here (no GPU on the machine that calibrated the rest):
# PyTorch's CUDA context commonly costs 1-3 GB of host memory; 2 GiB is planned.
CUDA_HOST_MB = 2048
# Loading a real model converts the checkpoint on the host: three fp32 copies at the peak.
LOAD_COPIES = 3


def runtime_bytes(kind: str = "model", device: str = "cpu") -> int:
    """Resident bytes of a job's process before its work: the interpreter and libraries of
    `kind` (RUNTIME_MB), plus the CUDA runtime's host share on a GPU."""
    cuda = CUDA_HOST_MB if device.startswith("cuda") else 0
    return (RUNTIME_MB[kind] + cuda) * MiB


def load_bytes(n_params: int) -> int:
    """Host bytes of loading a real model of `n_params` (LOAD_COPIES fp32 copies)."""
    return LOAD_COPIES * 4 * n_params


def measure_runtime_bytes(kind: str) -> int:
    """The resident set of a fresh interpreter after importing RUNTIME_MODULES[kind]."""
    import subprocess
    import sys

    code = (
        "import importlib\n"
        f"for m in {RUNTIME_MODULES[kind]!r}: importlib.import_module(m)\n"
        # VmHWM read here: importing this module would add its own imports to the measure.
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    return int(done.stdout.split()[-1]) * 1024  # kB
