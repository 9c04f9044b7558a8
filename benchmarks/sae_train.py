"""SAE training: the gpu trainer (sae.stacked), the fast trainer (sae.fast), SAELens's trainer and
EleutherAI's sparsify, side by side on the same tokens.

    python benchmarks/sae_train.py --sizes gpt2 --device cpu \
        --json benchmarks/results/sae_train-cpu.json     # CPU: ~20 CPU-minutes on 2 cores
    python benchmarks/sae_train.py --sizes gpt2 --device cuda \
        --json benchmarks/results/sae_train-cuda.json    # batch 4096, bf16 (make bench-gpu)
    python benchmarks/sae_train.py --sizes small --rounds 1     # a quick check

For each size, the stage's trainers (`build_trainer` with `sae.trainer` gpu, fast or saelens,
ActivationStream over one HDF5 file, the same seed, so the same initialisation and batches)
train the same TopK SAE config for the same steps. A latent counts as dead after
`--dead-window-steps` silent steps, so the AuxK loss is on for most steps, as in the steady
state of a long run. Rounds alternate the order of the trainers; shared machines are noisy, so
each speed-up is the median of the per-round ratios. `--trainers` picks which run.

sparsify (`eai-sparsify` from PyPI, installed in the benchmark's environment only: `pip install
--no-deps --target DIR eai-sparsify natsort schedulefree` and DIR on PYTHONPATH, the rest of its
requirements being circuitflow's) trains its SparseCoder (TopK, the same width and k) with its
trainer's SAE step: FVU + AuxK (alpha 1/32, its dead-latent rule in tokens, the same window),
gradients parallel to the decoder rows removed, Adam at its learning rate, unit-norm decoder
rows; on the same batches (raw: its loss is scale-free), bf16 autocast on CUDA as it does. Its
trainer's own loop also runs the model: only the SAE step is timed here. Where it is not
installed the JSON says so (`sparsify.skipped`).

Timing: on CUDA two events (after the first step, after the last), so nothing is synchronised
per step; on CPU the wall clock (and the process's CPU time) between the same two points.
Every figure is written to `--json` as soon as it is measured.

Quality: each trained SAE is saved in SAELens's format and reloaded (sparsify's is read through
its own encode/decode), and measured on 2,048 held-out activations: explained variance (the
deltas are SAELens's minus each trainer's), L0 and the stage's dead fraction. The activations
are sparse sums of random directions plus noise, so a good SAE has something to find.

Roofline: the dense work SAELens's step does (12 d_in d_sae FLOPs per token) against the peak
of the dtype the step computes in (bf16 under autocast; float32, TF32 where enabled), measured
on a matmul of the step's shape ([batch, d_in] x [d_in, d_sae]). The gpu step's own count
(`gpu_step_flops_per_token`: 10 d_in d_sae, 16 with AuxK) gives its share of that peak.

`--profile-steps N`: N steady-state steps of each of our trainers under torch.profiler: kernels
launched (CUDA) or aten ops run (CPU) per step, FLOPs per step, and the top ops by time.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once

import numpy as np  # noqa: E402
import torch  # noqa: E402

from circuitflow.capture.files import read_activation_info, write_activation_file  # noqa: E402
from circuitflow.io import write_json  # noqa: E402
from circuitflow.perf import sae_training_flops_per_token, synchronize  # noqa: E402
from circuitflow.sae.architectures import build_training_sae  # noqa: E402
from circuitflow.sae.config import SAETrainConfig  # noqa: E402
from circuitflow.sae.data import ActivationStream, ActivationStreamConfig  # noqa: E402
from circuitflow.sae.trainer import trainer_config  # noqa: E402
from circuitflow.sae.trainer_choice import Choice  # noqa: E402
from circuitflow.sae.trainers import build_trainer  # noqa: E402

OURS = ("gpu", "fast", "saelens")
TRAINERS = (*OURS, "sparsify")


@dataclass(frozen=True)
class Size:
    d_in: int
    expansion: int
    k: int
    # Steps and rounds by device: enough for steady rates, within ~20 minutes on 2 CPU cores.
    cpu_steps: int
    cpu_rounds: int
    gpu_steps: int = 200
    gpu_rounds: int = 5


SIZES = {
    "small": Size(d_in=64, expansion=8, k=16, cpu_steps=100, cpu_rounds=4),
    "cpu": Size(d_in=256, expansion=16, k=32, cpu_steps=20, cpu_rounds=3),
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


# --- timing ---------------------------------------------------------------------------------------
class Clock:
    """Time from the end of the first step to the end of the last: CUDA events (no
    synchronisation until `seconds`), else the wall clock and this process's CPU time."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append((time.perf_counter(), time.process_time()))

    def seconds(self) -> tuple[float, float | None]:
        """(wall seconds, CPU seconds or None on CUDA) between the two marks."""
        first, last = self.marks[0], self.marks[-1]
        if self.cuda:
            last.synchronize()
            return first.elapsed_time(last) / 1000, None
        return last[0] - first[0], last[1] - first[1]


# --- one training run -----------------------------------------------------------------------------
@dataclass
class Run:
    tokens_per_s: float  # steps after the first
    cpu_tokens_per_s: float | None  # this process's CPU time (all threads), the same steps
    explained_variance: float
    l0: float
    dead_fraction: float


def train_one(trainer: str, cfg: SAETrainConfig, path: Path, held_out: torch.Tensor, args) -> Run:
    """Train with `trainer` (ours as the stage would, or sparsify), measure the result."""
    info = read_activation_info(path)
    steps = cfg.total_tokens // int(cfg.batch_size)
    clock = Clock(args.device)
    torch.manual_seed(cfg.seed)
    stream_cfg = ActivationStreamConfig(
        batch_size=int(cfg.batch_size), seed=cfg.seed, device=args.device
    )
    with ActivationStream(info, stream_cfg) as stream:
        if trainer == "sparsify":
            encode, dead = train_sparsify(cfg, info.d_in, stream, steps, clock, args)
        else:
            encode, dead = train_ours(trainer, cfg, info, stream, steps, clock, args)
    wall, cpu = clock.seconds()
    tokens = (steps - 1) * int(cfg.batch_size)  # the steps between the two marks
    ev, l0 = explained_variance(encode, held_out.to(args.device))
    return Run(tokens / wall, tokens / cpu if cpu else None, ev, l0, dead)


def train_ours(trainer: str, cfg, info, stream, steps: int, clock: Clock, args):
    from sae_lens import SAE

    tcfg = dataclasses.replace(
        trainer_config(cfg, info, args.device),
        n_batches_for_norm_estimate=4,
        dead_feature_window=args.dead_window_steps,
    )
    marked = {0, steps - 1}

    def after_step(tr) -> None:
        if tr.n_training_steps in marked:
            clock.mark()

    sae = build_training_sae(cfg, info.d_in, info.hook_name, args.device)
    choice = Choice(trainer, "benchmark", "")
    tr = build_trainer(cfg, tcfg, sae, stream, after_step=after_step, choice=choice)
    tr.fit()
    dead = (tr.n_forward_passes_since_fired >= args.dead_window_steps).float().mean().item()
    with tempfile.TemporaryDirectory() as tmp:
        tr.sae.save_inference_model(tmp)
        saved = SAE.load_from_disk(tmp, device=args.device)
    return (lambda rows: saved.decode(saved.encode(rows)), saved.encode), dead


def train_sparsify(cfg, d_in: int, stream, steps: int, clock: Clock, args):
    """sparsify's trainer's SAE step (see the module's doc) for `steps` batches of `stream`."""
    from sparsify import SparseCoder, SparseCoderConfig

    sae = SparseCoder(d_in, SparseCoderConfig(expansion_factor=cfg.expansion_factor, k=cfg.k),
                      device=args.device, dtype=torch.float32)  # fmt: skip
    lr = 2e-4 / (sae.num_latents / 2**14) ** 0.5  # its trainer's Adam learning rate
    opt = torch.optim.Adam(sae.parameters(), lr=lr)
    since_fired = torch.zeros(sae.num_latents, dtype=torch.long, device=args.device)
    threshold = args.dead_window_steps * int(cfg.batch_size)  # in tokens, as sparsify counts
    for step in range(steps):
        x = next(stream)
        out = sae(x, dead_mask=since_fired > threshold)
        (out.fvu + out.auxk_loss / 32).backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        opt.step()
        opt.zero_grad()
        sae.set_decoder_norm_to_unit_norm()
        fired = torch.zeros_like(since_fired, dtype=torch.bool)
        fired[out.latent_indices.flatten()] = True
        since_fired += len(x)
        since_fired[fired] = 0
        if step in (0, steps - 1):
            clock.mark()
    dead = (since_fired >= threshold).float().mean().item()

    def decode(rows: torch.Tensor) -> torch.Tensor:
        return sae(rows).sae_out.float()

    def encode(rows: torch.Tensor) -> torch.Tensor:
        acts, idx, _ = sae.encode(rows)
        return torch.zeros(len(rows), sae.num_latents, device=rows.device).scatter_(
            1, idx, acts.float()
        )

    return (decode, encode), dead


@torch.no_grad()
def explained_variance(fns, x: torch.Tensor, batch: int = 1024) -> tuple[float, float]:
    """1 - squared error / total variance about the mean (float64 sums), and the mean L0."""
    reconstruct, encode = fns
    err = l0 = 0.0
    for start in range(0, len(x), batch):
        rows = x[start : start + batch]
        err += (reconstruct(rows) - rows).double().pow(2).sum().item()
        l0 += (encode(rows) != 0).sum().item()
    xd = x.double()
    total = (xd - xd.mean(0)).pow(2).sum().item()
    return 1.0 - err / total, l0 / len(x)


def sparsify_missing() -> str | None:
    try:
        import sparsify  # noqa: F401
    except ImportError as err:
        return (
            f"eai-sparsify is not installed in this environment ({err}): pip install --no-deps "
            "--target DIR eai-sparsify natsort schedulefree, DIR on PYTHONPATH"
        )
    return None


# --- the peak of the dtype used -------------------------------------------------------------------
def compute_dtype(device: str, autocast: bool) -> str:
    if autocast:
        return "bfloat16"
    tf32 = device.startswith("cuda") and torch.backends.cuda.matmul.allow_tf32
    return "tf32" if tf32 else "float32"


def matmul_rate(device: str, dtype: str, m: int, k: int, n: int, reps: int = 10) -> float:
    """FLOP/s of an [m, k] x [k, n] matmul in `dtype` (the best of 3 rounds; CUDA events)."""
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    a = torch.randn(m, k, device=device, dtype=torch_dtype)
    b = torch.randn(k, n, device=device, dtype=torch_dtype)
    a @ b
    best = 0.0
    for _ in range(3):
        clock = Clock(device)
        synchronize(device)
        clock.mark()
        for _ in range(reps):
            a @ b
        clock.mark()
        best = max(best, 2 * m * k * n * reps / clock.seconds()[0])
    return best


def gpu_step_flops_per_token(d_in: int, d_sae: int, aux: bool) -> float:
    """The gpu step's dense products a token: the encoder, the decoder, W_dec's gradient, the
    selected weights' gradient and W_enc's (5 of 2 d_in d_sae); AuxK adds its decoder, its
    W_dec gradient and its weights' gradient (3 more)."""
    return (16 if aux else 10) * d_in * d_sae


# --- profile --------------------------------------------------------------------------------------
def profile(trainer: str, cfg, path: Path, args) -> dict:
    """`args.profile_steps` steady-state steps of `trainer` under torch.profiler."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    info = read_activation_info(path)
    tcfg = dataclasses.replace(
        trainer_config(cfg, info, args.device), n_batches_for_norm_estimate=1,
        dead_feature_window=args.dead_window_steps,
    )  # fmt: skip
    n = args.profile_steps
    stream_cfg = ActivationStreamConfig(batch_size=int(cfg.batch_size), device=args.device)
    with ActivationStream(info, stream_cfg) as stream:
        sae = build_training_sae(cfg, info.d_in, info.hook_name, args.device)
        tr = build_trainer(cfg, tcfg, sae, stream, choice=Choice(trainer, "benchmark", ""))
        batches = [next(stream) for _ in range(args.dead_window_steps + 2 + n)]
        for b in batches[:-n]:  # latents die: AuxK on, as in the steady state
            tr.step(b)
        synchronize(args.device)
        cuda = args.device.startswith("cuda")
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with torch_profile(activities=acts, with_flops=True) as prof:
            for b in batches[-n:]:
                tr.step(b)
            synchronize(args.device)
    events = prof.key_averages()
    if cuda:
        kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
    else:
        kernels = sum(e.count for e in events if e.key.startswith("aten::"))
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:12]
    return {
        "steps": n,
        "kernels_per_step" if cuda else "aten_ops_per_step": kernels / n,
        "flops_per_step": sum(e.flops for e in events) / n,
        "top_ops": [
            {"op": e.key, "calls_per_step": e.count / n, "ms_per_step": getattr(e, key) / 1000 / n}
            for e in top
        ],  # fmt: skip
    }


# --- one size, every trainer ----------------------------------------------------------------------
def bench(name: str, args, out: dict, save: Callable[[], None], tmp: Path) -> dict:
    size = SIZES[name]
    gpu = args.device.startswith("cuda")
    steps = args.steps or (size.gpu_steps if gpu else size.cpu_steps)
    rounds = args.rounds or (size.gpu_rounds if gpu else size.cpu_rounds)
    autocast = {"on": True, "off": False, "auto": gpu}[args.autocast]
    batch, d_sae = args.batch, size.d_in * size.expansion
    path = tmp / f"{name}.h5"
    write_file(path, structured_activations(max(8 * batch, 65_536), size.d_in, seed=0))
    held_out = torch.from_numpy(structured_activations(2048, size.d_in, seed=1)).float()
    cfg = SAETrainConfig(architecture="topk", expansion_factor=size.expansion, k=size.k,
                         batch_size=batch, total_tokens=steps * batch, autocast=autocast,
                         device=args.device)  # fmt: skip
    dtype = compute_dtype(args.device, autocast)
    peak = matmul_rate(args.device, dtype, batch, size.d_in, d_sae)
    dense = sae_training_flops_per_token(size.d_in, d_sae)
    result = {
        "d_in": size.d_in, "d_sae": d_sae, "k": size.k, "batch_size": batch, "steps": steps,
        "rounds": rounds, "dead_window_steps": args.dead_window_steps, "autocast": autocast,
        "compute_dtype": dtype, "peak_flops_at_step_shape": peak,
        "roofline_tokens_per_s": peak / dense,
        "gpu_step_flops_per_token": gpu_step_flops_per_token(size.d_in, d_sae, aux=True),
        "first_in_round": [], "runs": {t: [] for t in args.trainers},
    }  # fmt: skip
    out["sizes"][name] = result
    missing = sparsify_missing() if "sparsify" in args.trainers else None
    trainers = [t for t in args.trainers if not (t == "sparsify" and missing)]
    if missing:
        result["sparsify"] = {"skipped": missing}
    runs: dict[str, list[Run]] = {t: [] for t in trainers}
    for r in range(rounds):
        order = trainers[r % len(trainers) :] + trainers[: r % len(trainers)]
        result["first_in_round"].append(order[0])
        for trainer in order:
            run = train_one(trainer, cfg, path, held_out, args)
            runs[trainer].append(run)
            result["runs"][trainer].append(dataclasses.asdict(run))
            summarise(result, runs, dense)
            save()
            print(f"  {name} round {r} {trainer:8s}: {run.tokens_per_s:12,.0f} tok/s, EV "
                  f"{run.explained_variance:.4f}", flush=True)  # fmt: skip
    if args.profile_steps:
        result["profile"] = {}
        for trainer in (t for t in OURS if t in trainers):
            result["profile"][trainer] = profile(trainer, cfg, path, args)
            save()
    print_line(name, result)
    return result


def summarise(result: dict, runs: dict[str, list[Run]], dense: float) -> None:
    """Each trainer's medians, its speed-up over SAELens's (median of per-round ratios), its
    explained variance below SAELens's and its share of the dtype's roofline, from the rounds
    run so far (`{trainer}_tokens_per_s` are the keys sae.trainers' auto choice reads)."""
    ref = runs.get("saelens", [])
    for t, rs in runs.items():
        if not rs:
            continue
        rate = statistics.median(r.tokens_per_s for r in rs)
        result[f"{t}_tokens_per_s"] = rate
        result.setdefault("explained_variance", {})[t] = statistics.median(
            r.explained_variance for r in rs
        )
        result.setdefault("l0", {})[t] = statistics.median(r.l0 for r in rs)
        result.setdefault("dead_fraction", {})[t] = statistics.median(r.dead_fraction for r in rs)
        result[f"{t}_share_of_roofline"] = rate / result["roofline_tokens_per_s"]
        pairs = list(zip(rs, ref, strict=False))
        if t != "saelens" and pairs:
            ratios = [a.tokens_per_s / b.tokens_per_s for a, b in pairs]
            result[f"{t}_speedup_vs_saelens"] = statistics.median(ratios)
            result[f"{t}_speedup_per_round"] = ratios
            if all(a.cpu_tokens_per_s for a, _ in pairs):
                result[f"{t}_speedup_by_cpu_time"] = statistics.median(
                    a.cpu_tokens_per_s / b.cpu_tokens_per_s for a, b in pairs
                )
            result[f"{t}_explained_variance_delta"] = statistics.median(
                b.explained_variance - a.explained_variance for a, b in pairs
            )
    if "gpu_tokens_per_s" in result:
        flops = result["gpu_step_flops_per_token"] * result["gpu_tokens_per_s"]
        result["gpu_step_share_of_peak_by_own_flops"] = flops / result["peak_flops_at_step_shape"]
    # The keys benchmarks/measure.py's screen reads: the fast trainer's, as before.
    for key in ("speedup_vs_saelens", "explained_variance_delta"):
        if f"fast_{key}" in result:
            result[key] = result[f"fast_{key}"]


def print_line(name: str, r: dict) -> None:
    parts = [
        f"{name}: d_in={r['d_in']} d_sae={r['d_sae']} k={r['k']} batch={r['batch_size']} "
        f"steps={r['steps']} {r['compute_dtype']} peak {r['peak_flops_at_step_shape']:.3g}"
    ]
    for t in TRAINERS:
        if f"{t}_tokens_per_s" in r:
            speedup = r.get(f"{t}_speedup_vs_saelens", 1.0)
            parts.append(
                f"{t} {r[f'{t}_tokens_per_s']:,.0f} tok/s ({speedup:.2f}x SAELens, EV "
                f"{r['explained_variance'][t]:.4f}, {r[f'{t}_share_of_roofline']:.3f} of roofline)"
            )
    print(" | ".join(parts), flush=True)


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
    p.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=list(TRAINERS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, help="steps per run (default: by size and device)")
    p.add_argument("--rounds", type=int, help="rounds per size (default: by size and device)")
    p.add_argument("--batch", type=int, default=None, help="default 1024 on CPU, 4096 on CUDA")
    p.add_argument("--dead-window-steps", type=int, default=4)
    p.add_argument(
        "--autocast", choices=["auto", "on", "off"], default="auto",
        help="bf16 autocast for every trainer (auto: on for CUDA)",
    )  # fmt: skip
    p.add_argument("--profile-steps", type=int, default=0, help="profile N steps per trainer")
    p.add_argument("--threads", type=int)
    p.add_argument("--json", type=Path, help="write the results here (as they are measured)")
    args = p.parse_args()
    if args.batch is None:
        args.batch = 4096 if args.device.startswith("cuda") else 1024
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # as the stages run (devices.enable_fast_math)
    t_start = time.perf_counter()
    headline = "gpt2" if "gpt2" in args.sizes else args.sizes[-1]
    out = {
        "benchmark": "sae_train",
        "command": "python benchmarks/sae_train.py " + " ".join(sys.argv[1:]),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": device_info(args.device),
        "headline_size": headline,
        "device": args.device,
        "sizes": {},
    }

    def save() -> None:
        head = out["sizes"].get(headline, {})
        for key in ("fast_tokens_per_s", "saelens_tokens_per_s", "gpu_tokens_per_s",
                    "speedup_vs_saelens", "explained_variance_delta", "steps"):  # fmt: skip
            if key in head:
                out[key] = head[key]
        out["seconds"] = time.perf_counter() - t_start
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            write_json(args.json, out)

    print(f"device={args.device} threads={torch.get_num_threads()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes:
            bench(name, args, out, save, Path(tmp))
    save()
    print(f"total {out['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
