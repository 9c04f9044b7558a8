#!/usr/bin/env python
"""The GPU benchmark suite: capture, SAE training and attribution on GPT-2 small and
Qwen2.5-0.5B architectures (random weights, no download) on the device it finds.

    python benchmarks/gpu_suite.py                       # cuda if present, else cpu
    python benchmarks/gpu_suite.py --small               # tiny sizes: a smoke test (< 1 minute)
    python benchmarks/gpu_suite.py --device cpu --models gpt2-small --out /tmp/cpu.json

Prints one line per stage and model (rate, peak memory against the memory plan, share of the
compute roofline, ratio to the bare forward pass) and writes them as JSON to
benchmarks/results/<device>.json; `python scripts/gpu_hours.py` turns that into the
GPU-hours of a full CSD3 run.

What it runs: each GPU stage on the real architectures with random weights.

For GPT-2 small and Qwen2.5-0.5B (architectures.py; same compute and memory as the real models,
no download) it runs, on one device, the stages' own code:

- `forward`: a bare forward pass (no hooks, `stop_at_layer` as capture uses it): the reference;
- `capture`: capture.capture() with every layer's resid_post hooked, writing HDF5 files;
- `sae_train`: SAE training as train_sae runs it (ActivationStream over a captured file, the
  trainer `sae.trainer` picks, the same trainer config: for TopK the fast sparse trainer) for the
  configs' SAE (TopK, 32x, k=32) and the schema's default SAE; tokens/s of the steady steps (the
  first is left out);
- `attribution`: attribution.scores.score_nodes() (method atp, all nodes, no exact patching)
  with an SAE spliced at every layer (12 for GPT-2, 24 for Qwen): the unit the stage's other
  parts repeat.

Each record has the rate, the measured peak memory next to the memory planner's estimate, the
FLOPs per token, the achieved FLOP/s, the device's peak (the datasheet figure for known GPUs,
else the measured matmul rate) and the share of it reached; report/gpu_hours.py turns a result file
into the GPU-hours of a full run.
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from circuitflow import memory, perf
from circuitflow.attribution import plan as attribution_plan
from circuitflow.devices import enable_fast_math, resolve_dtype
from circuitflow.memory import FAST_THRESHOLD, set_mmap_threshold, track_live_bytes_on_cpu
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.sae import plan as sae_plan

SAE_VARIANTS = {
    # config/gpt2-small.yaml and config/qwen2.5-0.5b.yaml
    "topk-32x-k32": {"architecture": "topk", "expansion_factor": 32, "k": 32},
    # the schema's defaults (a config without an sae: section)
    "default": {},
}


@dataclass(frozen=True)
class SuiteSizes:
    """How much work each stage gets; `n_layers`/`d_vocab` shrink the models (--small only)."""

    capture_tokens: int = 262_144
    context_length: int = 128
    capture_batch: int | None = None  # None: the capture stage's memory plan
    sae_steps: int = 50
    sae_batch: int = 4096
    attribution_prompts: int = 128
    prompt_length: int = 16
    attribution_batch: int = 64
    n_layers: int | None = None
    d_vocab: int | None = None
    disk_mib: int = 1024  # one fsync'd sequential write: the floor under capture's time


# On a GPU: enough work for steady rates. On a CPU: the same shapes, less work, so the whole suite
# finishes in minutes on 2 cores (rates are per token, so fewer tokens change only the noise).
GPU_SIZES = SuiteSizes()
CPU_SIZES = SuiteSizes(capture_tokens=2032, sae_steps=4, attribution_prompts=4, attribution_batch=4)
SMALL_SIZES = SuiteSizes(
    capture_tokens=504,
    context_length=64,
    sae_steps=3,
    sae_batch=64,
    attribution_prompts=4,
    prompt_length=8,
    attribution_batch=4,
    n_layers=2,
    d_vocab=1000,
    disk_mib=64,
)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def result_path(device: str, root: Path | str = "benchmarks/results") -> Path:
    """benchmarks/results/<device>.json: `cpu.json`, or the GPU's name as a slug."""
    if not device.startswith("cuda"):
        return Path(root) / "cpu.json"
    slug = re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")
    return Path(root) / f"{slug}.json"


def disk_write_speed(directory: Path, n_mib: int) -> float:
    """Bytes/s of one sequential write of `n_mib` MiB in 64 MiB blocks, fsync'd."""
    block = os.urandom(1 << 20) * 64
    path = Path(directory) / "disk_speed.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(max(1, n_mib // 64)):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - t0
    written = path.stat().st_size
    path.unlink()
    return written / seconds


@dataclass
class Suite:
    device: str
    sizes: SuiteSizes
    log: Callable[[str], None] = print
    results: list[dict] = field(default_factory=list)
    peaks: dict[str, Any] = field(default_factory=dict)
    timed_rerun: bool = True  # CPU: time a second run without live-byte tracking

    # --- device -----------------------------------------------------------------------------
    def measure_peaks(self) -> None:
        """Measure the matmul peak for each dtype in use, keeping the best of every call (a
        neighbour's load on a shared machine only ever lowers it). Called at the start and end."""
        name = device_name(self.device)
        dtypes = [torch.float32]
        if self.device.startswith("cuda"):
            dtypes.append(self.compute_dtype())
        measured = dict(self.peaks.get("measured", {}))
        for dt in dtypes:
            rate = perf.measured_peak_flops(self.device, dt)
            measured[perf.dtype_name(dt)] = max(rate, measured.get(perf.dtype_name(dt), 0.0))
        nominal = {
            perf.dtype_name(dt): perf.nominal_peak_flops(name, dt)
            for dt in dtypes
            if self.device.startswith("cuda") and perf.nominal_peak_flops(name, dt)
        }
        self.peaks = {"measured": measured, "nominal": nominal}
        self.log(
            f"device {self.device} ({name}), {torch.get_num_threads()} threads: measured matmul "
            + ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in measured.items())
            + (
                f"; datasheet {', '.join(f'{k} {v / 1e12:.0f}' for k, v in nominal.items())}"
                if nominal
                else ""
            )
        )

    def roofline(self, rec: dict) -> None:
        """Set a record's device peak (FLOP-weighted over the dtypes its work ran in), the
        peak's source and its roofline share."""
        mix = rec["flops_by_dtype"]
        total = sum(mix.values())
        peaks = {dt: self.peak(dt) for dt in mix}
        rec["device_peak_flops"] = total / sum(f / peaks[dt][0] for dt, f in mix.items())
        rec["peak_source"] = (
            "nominal" if all(v[1] == "nominal" for v in peaks.values()) else "measured"
        )
        rec["roofline_share"] = rec["achieved_flops"] / rec["device_peak_flops"]

    def finish(self) -> None:
        """Re-measure the peak, then set every record's roofline share against the best one.
        Where a stage ran one dtype faster than the matmul benchmark did (its runs disturbed by
        a neighbour on a shared machine), the device's peak is at least that stage's rate: the
        peak is raised to it, and `peak_flops.raised_to_achieved` says so."""
        self.measure_peaks()
        raised = {}
        for rec in self.results:
            (dtype,) = rec["flops_by_dtype"] if len(rec["flops_by_dtype"]) == 1 else (None,)
            measured = self.peaks["measured"]
            if (
                dtype
                and dtype not in self.peaks["nominal"]
                and rec["achieved_flops"] > measured.get(dtype, 0)
            ):
                measured[dtype] = raised[dtype] = rec["achieved_flops"]
        self.peaks["raised_to_achieved"] = raised
        for rec in self.results:
            self.roofline(rec)
            self.log(self.line(rec))

    def peak(self, dtype: torch.dtype | str) -> tuple[float, str]:
        """The rate a roofline share is taken against: datasheet for known GPUs, else measured."""
        key = perf.dtype_name(dtype)
        if key in self.peaks.get("nominal", {}):
            return self.peaks["nominal"][key], "nominal"
        measured = self.peaks["measured"]
        return measured.get(key, measured["float32"]), "measured"

    def compute_dtype(self) -> torch.dtype:
        return resolve_dtype("auto", self.device.split(":")[0])

    def record(self, **fields: Any) -> dict:
        rec = {"device": self.device, **fields}
        if rec.get("peak_memory_bytes") and rec.get("planned_memory_bytes"):
            rec["plan_ratio"] = rec["planned_memory_bytes"] / rec["peak_memory_bytes"]
        self.roofline(rec)
        self.results.append(rec)
        self.log(self.line(rec))
        return rec

    @staticmethod
    def line(rec: dict) -> str:
        unit = "prompts/s" if "prompts_per_s" in rec else "tok/s"
        rate = rec["prompts_per_s"] if "prompts_per_s" in rec else rec["tokens_per_s"]
        mem = ""
        if rec.get("peak_memory_bytes"):
            mem = f" | peak {rec['peak_memory_bytes'] / memory.MiB:,.0f} MiB"
            if rec.get("planned_memory_bytes"):
                mem += f", planned {rec['planned_memory_bytes'] / memory.MiB:,.0f} MiB"
        ratio = f" | x forward {rec['ratio_to_forward']:.2f}" if "ratio_to_forward" in rec else ""
        return (
            f"{rec['model']:13s} {rec['stage']:11s} {rec.get('variant', ''):13s} "
            f"{rate:12,.2f} {unit}{mem} | roofline {rec['roofline_share']:.1%}{ratio}"
        )

    # --- measuring --------------------------------------------------------------------------
    def measure(self, work: Callable[[], Any]) -> tuple[Any, int, float]:
        """Run `work` once for memory and time: (its result, peak bytes it added, seconds).

        On CUDA one run gives both. On CPU the memory run tracks live bytes (see
        track_live_bytes_on_cpu), which slows allocation, so a second run is timed with glibc's
        usual allocation (unless `timed_rerun` is off: --small, a smoke test)."""
        cuda = self.device.startswith("cuda")
        if not cuda:
            track_live_bytes_on_cpu()
        with memory.PeakMeter(self.device) as meter:
            perf.synchronize(self.device)
            t0 = time.perf_counter()
            result = work()
            perf.synchronize(self.device)
            seconds = time.perf_counter() - t0
        if not cuda:
            set_mmap_threshold(FAST_THRESHOLD)
        if not cuda and self.timed_rerun:
            memory.free_device_memory(self.device)
            t0 = time.perf_counter()
            result = work()
            seconds = time.perf_counter() - t0
        return result, meter.delta, seconds

    # --- stages -----------------------------------------------------------------------------
    def run_model(self, name: str, workdir: Path) -> None:
        enable_fast_math(self.device)
        sizes = self.sizes
        overrides = {
            k: v for k, v in (("n_layers", sizes.n_layers), ("d_vocab", sizes.d_vocab)) if v
        }
        dtype = self.compute_dtype()
        torch.manual_seed(0)
        from transformer_lens import HookedTransformer

        cfg = architectures.config(name, device=self.device, dtype=dtype, seed=0, **overrides)
        model = HookedTransformer(cfg).eval()
        n_params = sum(p.numel() for p in model.parameters())
        weights = n_params * memory.dtype_bytes(dtype)
        rng = np.random.default_rng(0)
        ctx = sizes.context_length
        n_ctx = max(1, sizes.capture_tokens // (ctx - 1))
        tokens = rng.integers(1, cfg.d_vocab, size=(n_ctx, ctx)).astype(np.int32)
        tokens[:, 0] = 0
        files = self.capture(name, model, tokens, weights, workdir)
        for variant, overrides in SAE_VARIANTS.items():
            self.sae_train(
                name, variant, overrides, model, files[cfg.n_layers // 2], weights, workdir
            )
        self.attribution(name, model, weights)
        del model
        memory.free_device_memory(self.device)

    def _forward_rate(self, model, tokens: np.ndarray, batch: int, stop_at: int | None) -> float:
        """Tokens/s of a hook-free forward over `tokens` (after one warm-up batch), best of 2."""

        def run(rows: np.ndarray) -> None:
            with torch.inference_mode():
                for a in range(0, len(rows), batch):
                    x = torch.from_numpy(np.asarray(rows[a : a + batch], dtype=np.int64))
                    model(x.to(self.device), stop_at_layer=stop_at)

        run(tokens[:batch])
        best = float("inf")
        for _ in range(2):  # the better of two: a shared machine's neighbours only slow it
            perf.synchronize(self.device)
            t0 = time.perf_counter()
            run(tokens)
            perf.synchronize(self.device)
            best = min(best, time.perf_counter() - t0)
        return tokens.size / best

    def capture(self, name, model, tokens, weights: int, workdir: Path) -> dict[int, Path]:
        from circuitflow.capture.config import CaptureConfig
        from circuitflow.capture.stage import capture

        cfg = model.cfg
        layers = list(range(cfg.n_layers))
        targets = {("resid_post", layer): workdir / f"layer_{layer}.h5" for layer in layers}
        opts = CaptureConfig(batch_size=self.sizes.capture_batch)
        meta = {"model_hash": "suite", "token_set_hash": "suite", "bos_token_id": 0}

        def work():
            for path in targets.values():
                path.unlink(missing_ok=True)
            return capture(model, tokens, meta, targets, opts, progress=False)

        result, used, _ = self.measure(work)
        batch = result.batch_size
        fwd = self._forward_rate(model, tokens, batch, cfg.n_layers)
        ctx = tokens.shape[1]
        flops = forward_flops_per_token(cfg, ctx, unembed=False)
        mix = {perf.dtype_name(cfg.dtype): 1.0}
        self.record(
            model=name,
            stage="forward",
            variant="no hooks",
            tokens_per_s=fwd,
            tokens=int(tokens.size),
            batch_size=batch,
            dtype=perf.dtype_name(cfg.dtype),
            flops_per_token=flops,
            achieved_flops=flops * fwd,
            flops_by_dtype=mix,
        )
        # capture's rate counts stored rows (BOS left out); per forward token for the ratio.
        rate = tokens.size / result.seconds
        self.record(
            model=name,
            stage="capture",
            variant=f"{len(targets)} hooks",
            tokens_per_s=rate,
            tokens=int(tokens.size),
            stored_rows=result.n_tokens,
            seconds=result.seconds,
            batch_size=batch,
            dtype=perf.dtype_name(cfg.dtype),
            peak_memory_bytes=used + weights,
            planned_memory_bytes=int(result.planned_peak_mb * memory.MiB),
            flops_per_token=flops,
            achieved_flops=flops * rate,
            flops_by_dtype=mix,
            ratio_to_forward=rate / fwd,
            write_mb_per_s=result.bytes_written / result.seconds / 1e6,
        )
        return {layer: targets[("resid_post", layer)] for layer in layers}

    def sae_train(self, name, variant, overrides, model, path: Path, resident: int, workdir):
        from circuitflow.capture.files import read_activation_info
        from circuitflow.sae.architectures import build_training_sae
        from circuitflow.sae.config import SAETrainConfig
        from circuitflow.sae.data import ActivationStream, ActivationStreamConfig
        from circuitflow.sae.stage import memory_estimate
        from circuitflow.sae.trainer import trainer_config
        from circuitflow.sae.trainers import build_trainer

        sizes = self.sizes
        info = read_activation_info(path)
        base = {"batch_size": sizes.sae_batch}
        cfg = SAETrainConfig.from_dict(
            base | overrides | {"total_tokens": sizes.sae_steps * sizes.sae_batch},
            device=self.device,
        )
        # One norm-estimate batch; a one-step dead window puts TopK's auxiliary loss on dead
        # latents in every step, as in the steady state of a real run (where latents dead over
        # the window exist), rather than only after the window's first 200k tokens.
        tcfg = dataclasses.replace(
            trainer_config(cfg, info, self.device),
            n_batches_for_norm_estimate=1,
            dead_feature_window=1,
        )
        stamps: list[float] = []

        def after_step(_trainer) -> None:
            perf.synchronize(self.device)
            stamps.append(time.perf_counter())

        stream_cfg = ActivationStreamConfig(
            batch_size=cfg.batch_size,
            shuffle_buffer_tokens=cfg.shuffle_buffer_tokens,
            device=self.device,
        )

        def work() -> None:
            stamps.clear()
            torch.manual_seed(0)
            with ActivationStream(info, stream_cfg) as stream:
                sae = build_training_sae(cfg, info.d_in, info.hook_name, self.device)
                trainer = build_trainer(cfg, tcfg, sae, stream, after_step=after_step)
                trainer.fit()
                del trainer, sae

        _, used, _ = self.measure(work)
        steps = len(stamps) - 1  # the first step (lazy optimiser state, kernels) is left out
        rate = steps * cfg.batch_size / (stamps[-1] - stamps[0])
        d_sae = cfg.d_sae or cfg.expansion_factor * info.d_in
        flops = perf.sae_training_flops_per_token(info.d_in, d_sae)
        planned = memory_estimate(cfg, info, self.device, resident).total(cfg.batch_size)
        self.record(
            model=name,
            stage="sae_train",
            variant=variant,
            architecture=cfg.architecture,
            trainer=cfg.trainer_on(self.device),
            d_in=info.d_in,
            d_sae=d_sae,
            k=cfg.k,
            tokens_per_s=rate,
            tokens=steps * cfg.batch_size,
            steps=steps,
            batch_size=cfg.batch_size,
            dtype="float32",
            peak_memory_bytes=used + resident,
            planned_memory_bytes=planned,
            flops_per_token=flops,
            achieved_flops=flops * rate,
            flops_by_dtype={"float32": 1.0},
        )

    def attribution(self, name: str, model, weights: int) -> None:
        import pandas as pd
        from sae_lens import TopKSAE, TopKSAEConfig
        from sae_lens.saes.sae import SAEMetadata

        from circuitflow.attribution import scores
        from circuitflow.attribution.config import AttributionConfig
        from circuitflow.nodes import hook_name

        sizes = self.sizes
        cfg = model.cfg
        d, d_sae, t = cfg.d_model, 32 * cfg.d_model, sizes.prompt_length
        saes = {}
        for layer in range(cfg.n_layers):
            hook = hook_name("resid_post", layer)
            sae_cfg = TopKSAEConfig(
                d_in=d, d_sae=d_sae, k=32, device=self.device, metadata=SAEMetadata(hook_name=hook)
            )
            saes[hook] = TopKSAE(sae_cfg).eval().requires_grad_(False)
        resident = weights + sum(sae_plan.sae_param_bytes(d, d_sae) for _ in saes)
        rng = np.random.default_rng(1)
        n = sizes.attribution_prompts
        clean = rng.integers(1, cfg.d_vocab, (n, t))
        corrupted = clean.copy()
        corrupted[:, 1 : t // 2] = rng.integers(1, cfg.d_vocab, (n, t // 2 - 1))
        prompts = pd.DataFrame(
            {
                "prompt_id": np.arange(n),
                "clean_tokens": list(clean),
                "corrupted_tokens": list(corrupted),
                "answer_id": rng.integers(1, cfg.d_vocab, n),
                "distractor_id": rng.integers(1, cfg.d_vocab, n),
            }
        )
        acfg = AttributionConfig(
            method="atp",
            validation_heads=0,
            validation_features=0,
            batch_size=sizes.attribution_batch,
        )
        scores.score_nodes(model, prompts.iloc[:1], saes, acfg)  # warm-up
        result, used, _ = self.measure(lambda: scores.score_nodes(model, prompts, saes, acfg))
        # The fast pass alone (the exact check on the validation prompts is charged by count).
        seconds = result.seconds["fast"]
        rate = n / seconds
        fwd = self._forward_rate(model, clean.astype(np.int32), sizes.attribution_batch, None) / t
        passes = attribution_plan.passes(cfg, len(saes), acfg, n, d_sae)["atp"]
        model_flops = forward_flops_per_token(cfg, t) * t * passes
        sae_flops = perf.spliced_sae_flops_per_token(d, d_sae) * len(saes) * t * passes
        flops = model_flops + sae_flops
        # The model runs in its dtype, the SAEs in float32.
        mix = {perf.dtype_name(cfg.dtype): model_flops / flops}
        mix["float32"] = mix.get("float32", 0.0) + sae_flops / flops
        estimate = attribution_plan.estimate_attribution(
            cfg, sum(p.numel() for p in model.parameters()), t, len(saes), d_sae, cfg.dtype,
            self.device, method="atp",
        )  # fmt: skip
        self.record(
            model=name,
            stage="attribution",
            variant=f"atp, {len(saes)} SAEs",
            method="atp",
            n_saes=len(saes),
            d_sae=d_sae,
            prompt_length=t,
            prompts_per_s=rate,
            tokens_per_s=rate * t,
            prompts=n,
            seconds=seconds,
            batch_size=sizes.attribution_batch,
            dtype=perf.dtype_name(cfg.dtype),
            peak_memory_bytes=used + resident,
            planned_memory_bytes=estimate.total(min(n, sizes.attribution_batch)),
            forward_passes=passes,
            flops_per_prompt=flops,
            flops_per_token=flops / t,
            achieved_flops=flops * rate,
            flops_by_dtype=mix,
            ratio_to_forward=rate / fwd,
        )
        saes.clear()
        memory.free_device_memory(self.device)


def run(
    models: list[str],
    device: str,
    sizes: SuiteSizes,
    mode: str,
    log: Callable[[str], None] = print,
    workdir: Path | str | None = None,
) -> dict:
    """Run the suite; returns the JSON-ready result (see the module docstring)."""
    for name in models:
        architectures.config(name)  # unknown names fail before anything runs
    live = set_mmap_threshold(FAST_THRESHOLD) if not device.startswith("cuda") else None
    os.environ.setdefault("TQDM_DISABLE", "1")
    suite = Suite(device, sizes, log, timed_rerun=mode != "small")
    suite.measure_peaks()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        disk = disk_write_speed(Path(tmp), sizes.disk_mib)
        log(f"disk: {disk / 1e6:,.0f} MB/s sequential write (fsync'd) where capture writes")
        for name in models:
            suite.run_model(name, Path(tmp))
    log("final figures, against the best peak measured at the start and the end:")
    suite.finish()
    return {
        "suite": "circuitflow gpu_suite",
        "mode": mode,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": {
            "type": device.split(":")[0],
            "name": device_name(device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            # CPU: peaks measured in a separate run with live-byte tracking, rates without it
            "cpu_memory_tracks_live_bytes": live,
        },
        "sizes": dataclasses.asdict(sizes),
        "gpu_sizes": dataclasses.asdict(GPU_SIZES),
        "reduced": sizes != GPU_SIZES,
        "peak_flops": suite.peaks,
        "disk_write_bytes_per_s": disk,
        "seconds": time.perf_counter() - started,
        "results": suite.results,
    }


def write(result: dict, path: Path | str) -> Path:
    from circuitflow.io import write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
    return path


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default=default_device(), help="cuda, cuda:1 or cpu")
    p.add_argument(
        "--models",
        nargs="+",
        default=["gpt2-small", "qwen2.5-0.5b"],
        choices=["gpt2-small", "qwen2.5-0.5b"],
    )
    p.add_argument("--small", action="store_true", help="2-layer models, tiny sizes (a smoke test)")
    p.add_argument(
        "--out", default=None, help="JSON to write (default benchmarks/results/<device>.json)"
    )
    p.add_argument("--capture-tokens", type=int, help="override: tokens captured per model")
    p.add_argument("--sae-steps", type=int, help="override: SAE training steps (>= 2)")
    p.add_argument("--sae-batch", type=int, help="override: SAE training batch (rows)")
    p.add_argument("--prompts", type=int, help="override: attribution prompts")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is visible")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.small:
        sizes, mode = SMALL_SIZES, "small"
    elif args.device.startswith("cuda"):
        sizes, mode = GPU_SIZES, "full"
    else:
        sizes, mode = CPU_SIZES, "full shapes, reduced work (CPU)"
    overrides = {
        "capture_tokens": args.capture_tokens,
        "sae_steps": args.sae_steps,
        "sae_batch": args.sae_batch,
        "attribution_prompts": args.prompts,
    }
    sizes = dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v})
    if sizes.sae_steps < 2:
        p.error("--sae-steps: at least 2 (the first step is not timed)")
    result = run(args.models, args.device, sizes, mode)
    out = write(result, args.out or result_path(args.device))
    print(f"wrote {out} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
