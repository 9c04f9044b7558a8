"""SAE training: the fast trainer (sae.fast) against SAELens's trainer, side by side.

    python benchmarks/sae_train.py --sizes gpt2 --device cpu \
        --json benchmarks/results/sae_train-cpu.json  # 6 CPU-minutes; 16 min wall at load 10
    python benchmarks/sae_train.py --sizes gpt2 --device cuda \
        --json benchmarks/results/sae_train-cuda.json         # batch 4096, bf16 autocast
    python benchmarks/sae_train.py --sizes small            # a quick check

For each size, both trainers train the same TopK SAE config (the stage's: `build_trainer` with
`sae.trainer` fast or saelens, ActivationStream over one HDF5 file, the same seed, so the same
initialisation and batches) for the same steps. A latent counts as dead after
`--dead-window-steps` silent steps, so the AuxK loss is on for most steps, as in the steady state
of a long run. Rounds alternate which trainer goes first; shared machines are noisy, so the
speed-up reported is the median of the per-round ratios (wall clock; CPU time beside it).

Quality: each trained SAE is saved in SAELens's format, reloaded with SAE.load_from_disk and
measured on 2,048 held-out activations: explained variance (`explained_variance_delta` = SAELens's
minus the fast trainer's), L0 and the stage's dead fraction. The activations are sparse sums of
random directions plus noise, so a good SAE has something to find.

The roofline is the dense work SAELens's step does (12 d_in d_sae FLOPs per token) at the
measured peak matmul rate; the fast trainer skips most of that work, so it can pass 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once

import numpy as np  # noqa: E402
import torch  # noqa: E402

from circuitflow.capture.files import read_activation_info, write_activation_file  # noqa: E402
from circuitflow.io import write_json  # noqa: E402
from circuitflow.perf import (  # noqa: E402
    measured_peak_flops,
    sae_training_flops_per_token,
    synchronize,
)
from circuitflow.sae.architectures import build_training_sae  # noqa: E402
from circuitflow.sae.config import SAETrainConfig  # noqa: E402
from circuitflow.sae.data import ActivationStream, ActivationStreamConfig  # noqa: E402
from circuitflow.sae.trainers import build_trainer  # noqa: E402
from circuitflow.sae.trainer import trainer_config  # noqa: E402

TRAINERS = ("fast", "saelens")


@dataclass(frozen=True)
class Size:
    d_in: int
    expansion: int
    k: int
    # Steps and rounds by device: enough for steady rates, within ~15 minutes on 2 CPU cores.
    cpu_steps: int
    cpu_rounds: int
    gpu_steps: int = 200
    gpu_rounds: int = 5


SIZES = {
    "small": Size(d_in=64, expansion=8, k=16, cpu_steps=100, cpu_rounds=4),
    "gpt2": Size(d_in=768, expansion=32, k=32, cpu_steps=8, cpu_rounds=3),  # GPT-2 small's
}


# --- activations ----------------------------------------------------------------------------------
def structured_activations(n: int, d: int, seed: int, chunk: int = 4096) -> np.ndarray:
    """[n, d] float16 rows: each a sum of 16 of 8 d random unit directions with exponential
    weights, plus Gaussian noise at 10% of the signal's scale (the directions are the same for
    every seed, the mixtures are not)."""
    dirs = np.random.default_rng(12345).standard_normal((8 * d, d)).astype(np.float32)
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    out = np.empty((n, d), np.float16)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        idx = rng.integers(0, len(dirs), (m, 16))
        coef = rng.exponential(1.0, (m, 16)).astype(np.float32)
        rows = np.einsum("mk,mkd->md", coef, dirs[idx])
        out[start : start + m] = rows + 0.1 * rng.standard_normal((m, d)).astype(np.float32)
    return out


def write_file(path: Path, acts: np.ndarray) -> None:
    attrs = {
        "hook_name": "blocks.0.hook_resid_post",
        "layer": 0,
        "site": "resid_post",
        "model_hash": "bench",
        "token_set_hash": "bench",
        "context_length": 129,
        "bos_excluded": True,
        "bos_token_id": 0,
    }
    write_activation_file(path, acts, np.zeros(len(acts), np.int32), attrs)


# --- one training run -----------------------------------------------------------------------------
@dataclass
class Run:
    tokens_per_s: float  # wall clock, steps after the first
    cpu_tokens_per_s: float  # this process's CPU time (all threads), the same steps
    explained_variance: float
    l0: float
    dead_fraction: float


def train_one(trainer: str, cfg: SAETrainConfig, path: Path, held_out: torch.Tensor, args) -> Run:
    """Train with `trainer` as the stage would, save and reload the SAE, measure it."""
    from sae_lens import SAE

    info = read_activation_info(path)
    tcfg = dataclasses.replace(
        trainer_config(cfg, info, args.device),
        n_batches_for_norm_estimate=4,
        dead_feature_window=args.dead_window_steps,
    )
    stamps: list[tuple[float, float]] = []

    def after_step(_trainer) -> None:
        synchronize(args.device)
        stamps.append((time.perf_counter(), time.process_time()))

    torch.manual_seed(cfg.seed)
    stream_cfg = ActivationStreamConfig(
        batch_size=int(cfg.batch_size), seed=cfg.seed, device=args.device
    )
    with ActivationStream(info, stream_cfg) as stream:
        sae = build_training_sae(cfg, info.d_in, info.hook_name, args.device)
        tr = build_trainer(cfg, tcfg, sae, stream, after_step=after_step)
        tr.fit()
    (t0, c0), (t1, c1) = stamps[0], stamps[-1]  # the first step (lazy state, kernels) left out
    tokens = (len(stamps) - 1) * int(cfg.batch_size)
    dead = (tr.n_forward_passes_since_fired >= args.dead_window_steps).float().mean().item()
    with tempfile.TemporaryDirectory() as tmp:
        tr.sae.save_inference_model(tmp)
        saved = SAE.load_from_disk(tmp, device=args.device)
    ev, l0 = explained_variance(saved, held_out.to(args.device))
    return Run(tokens / (t1 - t0), tokens / max(c1 - c0, 1e-9), ev, l0, dead)


@torch.no_grad()
def explained_variance(sae, x: torch.Tensor, batch: int = 1024) -> tuple[float, float]:
    """1 - squared error / total variance about the mean (float64 sums), and the mean L0."""
    err = l0 = 0.0
    for start in range(0, len(x), batch):
        rows = x[start : start + batch]
        feats = sae.encode(rows)
        err += (sae.decode(feats) - rows).double().pow(2).sum().item()
        l0 += (feats != 0).sum().item()
    xd = x.double()
    total = (xd - xd.mean(0)).pow(2).sum().item()
    return 1.0 - err / total, l0 / len(x)


# --- one size, both trainers ----------------------------------------------------------------------
def bench(name: str, args, peak: float, tmp: Path) -> dict:
    size = SIZES[name]
    gpu = args.device.startswith("cuda")
    steps = args.steps or (size.gpu_steps if gpu else size.cpu_steps)
    rounds = args.rounds or (size.gpu_rounds if gpu else size.cpu_rounds)
    autocast = {"on": True, "off": False, "auto": gpu}[args.autocast]
    batch = args.batch
    n_rows = max(8 * batch, 65_536)
    path = tmp / f"{name}.h5"
    write_file(path, structured_activations(n_rows, size.d_in, seed=0))
    held_out = torch.from_numpy(structured_activations(2048, size.d_in, seed=1)).float()
    cfg = SAETrainConfig(
        architecture="topk",
        expansion_factor=size.expansion,
        k=size.k,
        batch_size=batch,
        total_tokens=steps * batch,
        autocast=autocast,
        device=args.device,
    )
    runs: dict[str, list[Run]] = {t: [] for t in TRAINERS}
    order = []
    for r in range(rounds):
        first = TRAINERS if r % 2 == 0 else TRAINERS[::-1]
        order.append(first[0])
        for trainer in first:
            run = train_one(
                trainer, dataclasses.replace(cfg, trainer=trainer), path, held_out, args
            )
            runs[trainer].append(run)
            print(f"  {name} round {r} {trainer:7s}: {run.tokens_per_s:12,.0f} tok/s", flush=True)
    fast, ref = runs["fast"], runs["saelens"]
    ratios = [f.tokens_per_s / s.tokens_per_s for f, s in zip(fast, ref, strict=True)]
    cpu_ratios = [f.cpu_tokens_per_s / s.cpu_tokens_per_s for f, s in zip(fast, ref, strict=True)]
    d_sae = size.d_in * size.expansion
    roofline = peak / sae_training_flops_per_token(size.d_in, d_sae)

    def med(xs, key):
        return statistics.median(getattr(x, key) for x in xs)

    result = {
        "d_in": size.d_in,
        "d_sae": d_sae,
        "k": size.k,
        "batch_size": batch,
        "steps": steps,
        "rounds": rounds,
        "dead_window_steps": args.dead_window_steps,
        "autocast": autocast,
        "first_in_round": order,
        "fast_tokens_per_s": med(fast, "tokens_per_s"),
        "saelens_tokens_per_s": med(ref, "tokens_per_s"),
        "speedup_vs_saelens": statistics.median(ratios),
        "speedup_per_round": ratios,
        "speedup_by_cpu_time": statistics.median(cpu_ratios),
        "speedup_by_cpu_time_per_round": cpu_ratios,
        "explained_variance": {"fast": med(fast, "explained_variance"),
                               "saelens": med(ref, "explained_variance")},
        "explained_variance_delta": statistics.median(
            s.explained_variance - f.explained_variance for f, s in zip(fast, ref, strict=True)
        ),
        "dead_fraction": {"fast": med(fast, "dead_fraction"), "saelens": med(ref, "dead_fraction")},
        "l0": {"fast": med(fast, "l0"), "saelens": med(ref, "l0")},
        "roofline_tokens_per_s": roofline,
        "fast_share_of_roofline": med(fast, "tokens_per_s") / roofline,
        "saelens_share_of_roofline": med(ref, "tokens_per_s") / roofline,
    }  # fmt: skip
    print(
        f"{name:6s} d_in={size.d_in} d_sae={d_sae} k={size.k} batch={batch} steps={steps} "
        f"autocast={autocast}: fast {result['fast_tokens_per_s']:,.0f} tok/s | SAELens "
        f"{result['saelens_tokens_per_s']:,.0f} tok/s | speed-up {result['speedup_vs_saelens']:.2f}"
        f" (rounds {' '.join(f'{x:.2f}' for x in ratios)}; by CPU time "
        f"{result['speedup_by_cpu_time']:.2f}) | EV fast "
        f"{result['explained_variance']['fast']:.4f} SAELens "
        f"{result['explained_variance']['saelens']:.4f} (delta "
        f"{result['explained_variance_delta']:+.4f}) | dead fast "
        f"{result['dead_fraction']['fast']:.4f} SAELens {result['dead_fraction']['saelens']:.4f}"
        f" | fast/roofline {result['fast_share_of_roofline']:.3f}",
        flush=True,
    )
    return result


def device_info(device: str) -> dict:
    import platform

    import sae_lens

    info = {
        "device": device,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "sae_lens": sae_lens.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    else:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        info["load_average"] = os.getloadavg()
    return info


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", nargs="+", default=["small", "gpt2"], choices=list(SIZES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, help="steps per run (default: by size and device)")
    p.add_argument("--rounds", type=int, help="rounds per size (default: by size and device)")
    p.add_argument("--batch", type=int, default=None, help="default 1024 on CPU, 4096 on CUDA")
    p.add_argument("--dead-window-steps", type=int, default=4)
    p.add_argument(
        "--autocast", choices=["auto", "on", "off"], default="auto",
        help="bf16 autocast for both trainers (auto: on for CUDA)",
    )  # fmt: skip
    p.add_argument("--threads", type=int)
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    if args.batch is None:
        args.batch = 4096 if args.device.startswith("cuda") else 1024
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    peak = measured_peak_flops(args.device)
    print(f"device={args.device} threads={torch.get_num_threads()} peak matmul "
          f"{peak / 1e9:,.1f} GFLOP/s", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: bench(name, args, peak, Path(tmp)) for name in args.sizes}
    headline = "gpt2" if "gpt2" in results else args.sizes[-1]
    out = {
        "benchmark": "sae_train",
        "command": "python benchmarks/sae_train.py " + " ".join(sys.argv[1:]),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": device_info(args.device),
        "peak_matmul_flops": peak,
        "headline_size": headline,
        "speedup_vs_saelens": results[headline]["speedup_vs_saelens"],
        "explained_variance_delta": results[headline]["explained_variance_delta"],
        "fast_tokens_per_s": results[headline]["fast_tokens_per_s"],
        "saelens_tokens_per_s": results[headline]["saelens_tokens_per_s"],
        "device": args.device,
        "steps": results[headline]["steps"],
        "sizes": results,
        "seconds": time.perf_counter() - t_start,
    }
    print(f"total {out['seconds']:.0f} s", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, out)


if __name__ == "__main__":
    main()
