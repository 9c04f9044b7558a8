"""Requirements check and smoke test: can this machine run the configured pipeline?

`run_checks(config, outdir)` returns one record per check (`name`, `ok`, `value`, `detail`):
Python, the key packages, torch with CUDA (version, GPUs and their memory, bf16 and TF32),
free disk under the results directory, whether the config's `device` and `model.dtype` can work
on the device found, and a tiny forward pass and a tiny SAE training step on that device.
`scripts/check_env.py` and the `check` rule (`snakemake check`) print them and exit non-zero
with the list of what failed.

`job_python_problem()` is the cheap check Snakemake runs before the first job
(workflow/rules/common.smk): jobs call the `python` on PATH, which need not be the Python
Snakemake itself runs in (`.venv/bin/snakemake` from a cron job, without the environment
activated), and without it every job would fail with a raw ModuleNotFoundError.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

MIN_PYTHON = (3, 10)
# Distribution names the stages import; pygments is what `snakemake --report` needs.
REQUIRED_PACKAGES = (
    "torch",
    "transformer-lens",
    "sae-lens",
    "snakemake",
    "h5py",
    "numpy",
    "pandas",
    "pyarrow",
    "safetensors",
    "matplotlib",
    "pygments",
)
OPTIONAL_PACKAGES = ("snakemake-executor-plugin-slurm", "transformers")
DEFAULT_MIN_FREE_GB = 5.0
# What a stage job's Python must be able to import (module names), found without importing them.
JOB_MODULES = ("torch", "transformer_lens", "sae_lens", "h5py")
_FIND_MISSING = (
    "import importlib.util, sys; "
    "print(*(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
)


def job_python_problem(deployment: Iterable = (), path: str | None = None) -> str | None:
    """None when the `python` on `path` (default: PATH), the one the stage jobs call, can
    import JOB_MODULES, or when `deployment` (Snakemake's software deployment methods, e.g.
    `workflow.deployment_settings.deployment_method`) includes conda, whose environments bring
    their own; else one line saying which python lacks what and how to fix it. Costs one
    interpreter start (~30 ms; no module is imported)."""
    if "CONDA" in {str(getattr(m, "name", m)).upper() for m in deployment}:
        return None
    if sys.prefix != sys.base_prefix:  # Snakemake runs in a venv: most likely the one meant
        activate = f"activate the environment (`. {Path(sys.prefix) / 'bin' / 'activate'}`)"
    else:
        activate = "activate the environment (`. .venv/bin/activate`)"
    fix = f"{activate} or use `--sdm conda`"
    python = shutil.which("python", path=path)
    if python is None:
        return f"jobs run `python scripts/<stage>.py` but there is no `python` on PATH: {fix}"
    try:
        done = subprocess.run(
            [python, "-c", _FIND_MISSING, *JOB_MODULES], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"jobs run {python} (the `python` on PATH), which does not run ({err}): {fix}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"jobs run {python} (the `python` on PATH), which does not run ({why}): {fix}"
    missing = done.stdout.split()
    if not missing:
        return None
    return (
        f"jobs run {python} (the `python` on PATH), which cannot import {', '.join(missing)}: {fix}"
    )


def _record(name: str, ok: bool, value: Any = None, detail: str = "") -> dict:
    return {"name": name, "ok": bool(ok), "value": value, "detail": detail}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def check_python() -> dict:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info[:2] >= MIN_PYTHON
    need = ".".join(map(str, MIN_PYTHON))
    return _record("python", ok, version, "" if ok else f"Python >= {need} required")


def check_packages() -> list[dict]:
    out = []
    for name in REQUIRED_PACKAGES:
        version = _version(name)
        out.append(
            _record(f"package {name}", version is not None, version, "" if version else "missing")
        )
    for name in OPTIONAL_PACKAGES:
        out.append(_record(f"package {name} (optional)", True, _version(name) or "not installed"))
    return out


def device_facts() -> dict:
    """What torch sees: CUDA availability and version, GPUs (as provenance records them), and
    whether the first GPU has bf16 and TF32."""
    import torch

    from circuitflow.provenance import gpu_state

    facts: dict[str, Any] = {
        "torch": torch.__version__,
        **gpu_state(),
        "bf16": False,
        "tf32": False,
    }
    if facts["cuda_available"]:
        facts["bf16"] = bool(torch.cuda.is_bf16_supported())
        facts["tf32"] = torch.cuda.get_device_capability(0)[0] >= 8
    return facts


def check_torch(facts: dict) -> list[dict]:
    gpus = facts["gpus"]
    gpu_value = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in gpus) or "none"
    return [
        _record("torch", True, facts["torch"]),
        _record("cuda available", True, facts["cuda_available"]),
        _record("cuda version", True, facts["cuda_version"] or "none (CPU build)"),
        _record("cudnn version", True, facts["cudnn_version"]),
        _record("gpus", True, gpu_value),
        _record("bf16 on GPU", True, facts["bf16"]),
        _record("tf32 on GPU", True, facts["tf32"]),
    ]


def check_disk(outdir: Path | str, min_free_gb: float, plan: dict[str, int] | None = None) -> dict:
    """Free space on the file system that holds `outdir` (its nearest existing parent): at least
    `min_free_gb`, and at least what the configured run writes there (`plan`: bytes by part,
    resources.disk_plan)."""
    path = Path(outdir).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    free_gb = shutil.disk_usage(path).free / 2**30
    need_gb = max(min_free_gb, sum((plan or {}).values()) / 2**30)
    ok = free_gb >= need_gb
    detail = ""
    if not ok and plan and need_gb > min_free_gb:
        parts = ", ".join(f"{k.replace('_', ' ')} {v / 2**30:,.1f}" for k, v in plan.items())
        detail = f"the configured run writes {need_gb:,.1f} GiB under {path} ({parts} GiB)"
    elif not ok:
        detail = f"less than {min_free_gb:g} GiB free under {path}"
    return _record(f"free disk under {outdir}", ok, f"{free_gb:,.1f} GiB", detail)


def resolve_device(config: dict, facts: dict) -> tuple[str, list[dict]]:
    """The device and dtype the config asks for, checked against the hardware found."""
    requested = config["device"]
    dtype = config["model"]["dtype"]
    checks = []
    if requested == "cuda" and not facts["cuda_available"]:
        checks.append(
            _record(
                "config device",
                False,
                "cuda",
                "device: cuda but torch sees no GPU (CPU-only torch build, no GPU on this node, "
                "or CUDA_VISIBLE_DEVICES empty); use device: auto or cpu, or run on a GPU node",
            )
        )
        device = "cpu"
    else:
        device = "cuda" if requested in ("auto", "cuda") and facts["cuda_available"] else "cpu"
        checks.append(_record("config device", True, f"{requested} -> {device}"))
    if dtype == "bfloat16" and device == "cuda" and not facts["bf16"]:
        name = facts["gpus"][0]["name"] if facts["gpus"] else "this GPU"
        checks.append(
            _record(
                "config dtype",
                False,
                dtype,
                f"model.dtype: bfloat16 but {name} does not support bf16 (needs Ampere or newer);"
                " use model.dtype: float16 or auto",
            )
        )
    elif dtype == "float16" and device == "cpu":
        checks.append(
            _record("config dtype", True, dtype, "float16 on CPU is slow; auto picks float32")
        )
    else:
        checks.append(_record("config dtype", True, dtype))
    return device, checks


def _torch_dtype(dtype: str, device: str, facts: dict):
    import torch

    if dtype == "auto":
        if device == "cuda":
            return torch.bfloat16 if facts["bf16"] else torch.float16
        return torch.float32
    return getattr(torch, dtype)


def smoke_forward(device: str, dtype) -> dict:
    """A tiny TransformerLens model: one forward pass and a cached activation."""
    try:
        import torch
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        start = time.perf_counter()
        cfg = HookedTransformerConfig(
            n_layers=1, d_model=16, n_ctx=8, d_head=8, n_heads=2, d_vocab=32, act_fn="gelu",
            device=device, dtype=dtype, seed=0,
        )  # fmt: skip
        model = HookedTransformer(cfg)
        tokens = torch.randint(0, 32, (2, 8), device=device)
        logits, cache = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
        ok = bool(torch.isfinite(logits.float()).all()) and "blocks.0.hook_resid_post" in cache
        took = time.perf_counter() - start
        return _record(
            "tiny forward pass", ok, f"{device} {dtype} {took:.2f}s", "" if ok else "non-finite"
        )
    except Exception as err:  # noqa: BLE001 - any failure is the finding
        return _record("tiny forward pass", False, device, f"{type(err).__name__}: {err}")


def smoke_sae(device: str) -> dict:
    """A tiny SAELens TopK SAE: one optimiser step must lower nothing to NaN."""
    try:
        import torch
        from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

        start = time.perf_counter()
        torch.manual_seed(0)
        sae = TopKTrainingSAE(
            TopKTrainingSAEConfig(d_in=16, d_sae=64, k=4, device=device, dtype="float32")
        )
        optim = torch.optim.Adam(sae.parameters(), lr=1e-3)
        x = torch.randn(32, 16, device=device)
        loss = ((sae.decode(sae.encode(x)) - x) ** 2).mean()
        loss.backward()
        optim.step()
        ok = bool(torch.isfinite(loss))
        took = time.perf_counter() - start
        return _record(
            "tiny SAE step", ok, f"{device} loss {loss.item():.3f} {took:.2f}s", "" if ok else "NaN"
        )
    except Exception as err:  # noqa: BLE001
        return _record("tiny SAE step", False, device, f"{type(err).__name__}: {err}")


def run_checks(
    config: dict, outdir: Path | str | None = None, min_free_gb: float = DEFAULT_MIN_FREE_GB
) -> list[dict]:
    checks = [check_python(), *check_packages()]
    try:
        facts = device_facts()
    except ImportError as err:
        return [*checks, _record("torch import", False, None, str(err))]
    checks += check_torch(facts)
    from circuitflow import resources  # imports torch, checked above

    plan = resources.disk_plan(config) if "capture" in config else None
    checks.append(check_disk(outdir or config["outdir"], min_free_gb, plan))
    device, device_checks = resolve_device(config, facts)
    checks += device_checks
    dtype = _torch_dtype(config["model"]["dtype"], device, facts)
    if device == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = facts["tf32"]
    checks.append(smoke_forward(device, dtype))
    checks.append(smoke_sae(device))
    return checks


def failures(checks: list[dict]) -> list[dict]:
    return [c for c in checks if not c["ok"]]


def format_checks(checks: list[dict]) -> str:
    width = max(len(c["name"]) for c in checks)
    lines = []
    for c in checks:
        mark = "ok  " if c["ok"] else "FAIL"
        detail = f"  ({c['detail']})" if c["detail"] else ""
        lines.append(f"{mark} {c['name']:<{width}}  {c['value']}{detail}")
    bad = failures(checks)
    if bad:
        lines.append(f"\n{len(bad)} requirement(s) not met:")
        lines += [f"  - {c['name']}: {c['detail'] or c['value']}" for c in bad]
    else:
        lines.append("\nall requirements met")
    return "\n".join(lines)
