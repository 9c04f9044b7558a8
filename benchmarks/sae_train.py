"""SAE training throughput: circuitflow's stage vs plain SAELens vs the roofline.

    python benchmarks/sae_train.py                 # CPU default: small + GPT-2-small sized
    python benchmarks/sae_train.py --sizes gpt2 --steps 200 --device cuda
    python benchmarks/sae_train.py --sizes small --autocast   # + fp32 vs bf16 autocast, both paths
    python benchmarks/sae_train.py --sizes --quality results/activations/resid_post/layer_0.h5 \
        --model-dir results/model                  # fp32 vs bf16 autocast: EV, CE recovered, tok/s

Both paths train the same TopK SAE config with SAELens's SAETrainer on the same activations;
circuitflow streams them from HDF5 (shuffle buffer; prefetch thread on CUDA only), the baseline is
the in-memory iterator a SAELens user would write. Roofline = FLOPs/token x measured peak matmul
rate. Shared machines are noisy, so each size runs ``--rounds`` rounds that alternate which path
goes first, and the ratio reported is the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sae_lens.config import SAETrainerConfig
from sae_lens.training.sae_trainer import SAETrainer

from circuitflow.capture.files import read_activation_info, write_activation_file
from circuitflow.perf import measured_peak_flops, sae_training_flops_per_token
from circuitflow.sae.architectures import build_training_sae
from circuitflow.sae.config import SAETrainConfig
from circuitflow.sae.data import ActivationStream, ActivationStreamConfig
from circuitflow.sae.trainer import ControlledSAETrainer

SIZES = {"small": (64, 8, 16), "gpt2": (768, 32, 32)}  # d_in, expansion, k


def time_fit(trainer: SAETrainer, steps: int, batch: int, device: str) -> tuple[float, float]:
    """Tokens/s by wall clock and by this process's CPU time (all threads).

    On a shared CPU the wall clock mostly measures the neighbours; CPU time is the work done.
    """
    t, c = time.perf_counter(), time.process_time()
    trainer.fit()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t), steps * batch / (time.process_time() - c)


def bench(
    name: str,
    steps: int,
    batch: int,
    device: str,
    tmp: Path,
    peak: float,
    rounds: int,
    autocast: bool = False,
) -> None:
    d_in, exp, k = SIZES[name]
    n_rows = max(4 * batch, 65_536)
    acts = np.random.default_rng(0).standard_normal((n_rows, d_in)).astype(np.float16)
    path = tmp / f"{name}.h5"
    write_activation_file(
        path,
        acts,
        np.zeros(n_rows, np.int32),
        {
            "hook_name": "blocks.0.hook_resid_post",
            "layer": 0,
            "site": "resid_post",
            "model_hash": "x",
            "token_set_hash": "x",
            "context_length": 129,
            "bos_excluded": True,
            "bos_token_id": 0,
        },
    )
    cfg = SAETrainConfig(expansion_factor=exp, k=k, batch_size=batch, device=device)
    tcfg = SAETrainerConfig(
        total_training_samples=steps * batch,
        train_batch_size_samples=batch,
        lr=cfg.lr,
        lr_end=cfg.lr,
        device=device,
        n_batches_for_norm_estimate=1,
        autocast=autocast,
    )
    hook = "blocks.0.hook_resid_post"
    info = read_activation_info(path)
    data = torch.from_numpy(acts.astype(np.float32)).to(device)

    def ours() -> float:
        torch.manual_seed(0)
        with ActivationStream(info, ActivationStreamConfig(batch_size=batch, device=device)) as s:
            sae = build_training_sae(cfg, d_in, hook, device)
            return time_fit(
                ControlledSAETrainer(cfg=tcfg, sae=sae, data_provider=s), steps, batch, device
            )

    def in_memory():
        g = torch.Generator(device="cpu").manual_seed(0)
        while True:
            yield data[torch.randint(0, n_rows, (batch,), generator=g).to(device)]

    def base() -> float:
        torch.manual_seed(0)
        sae = build_training_sae(cfg, d_in, hook, device)
        return time_fit(
            SAETrainer(cfg=tcfg, sae=sae, data_provider=in_memory()), steps, batch, device
        )

    ours_r, base_r = [], []
    for r in range(rounds):
        if r % 2 == 0:
            ours_r.append(ours())
            base_r.append(base())
        else:
            base_r.append(base())
            ours_r.append(ours())
    ratios = [o[0] / b[0] for o, b in zip(ours_r, base_r, strict=True)]
    cpu_ratios = [o[1] / b[1] for o, b in zip(ours_r, base_r, strict=True)]
    o = statistics.median(x[0] for x in ours_r)
    b = statistics.median(x[0] for x in base_r)
    d_sae = d_in * exp
    # Encoder + dense decoder matmuls, forward and backward (x3): 12 * d_in * d_sae per token.
    roof = peak / sae_training_flops_per_token(d_in, d_sae)
    tag = "bf16-autocast" if autocast else "fp32"
    print(
        f"{name:6s} {tag:13s} d_in={d_in:4d} d_sae={d_sae:6d} k={k:3d} batch={batch}: "
        f"circuitflow {o:11,.0f} tok/s | SAELens in-memory {b:11,.0f} tok/s | "
        f"roofline {roof:13,.0f} tok/s | ours/SAELens {statistics.median(ratios):.2f} "
        f"(rounds: {' '.join(f'{x:.2f}' for x in ratios)}; by CPU time "
        f"{statistics.median(cpu_ratios):.2f}: {' '.join(f'{x:.2f}' for x in cpu_ratios)}) | "
        f"ours/roofline {o / roof:.3f}",
        flush=True,
    )


def quality(activations: Path, model_dir: Path, tokens: int, device: str, tmp: Path) -> None:
    """fp32 vs bf16 autocast through the whole stage on real activations: quality and speed."""
    from circuitflow.model.load import load_model
    from circuitflow.sae.stage import train_sae

    model = load_model(model_dir, device=device, dtype="float32")
    for autocast in (False, True):
        cfg = SAETrainConfig(total_tokens=tokens, device=device, autocast=autocast)
        m = train_sae(activations, tmp / f"q{int(autocast)}", cfg, model)
        print(
            f"quality {'bf16-autocast' if autocast else 'fp32':13s} topk k={cfg.k} "
            f"{m['tokens_trained']:,} tokens: explained_variance {m['explained_variance']:.4f} | "
            f"ce_loss_recovered {m['ce_loss_recovered']:.4f} | l0 {m['l0']:.1f} | "
            f"dead {m['dead_fraction']:.3f} | {m['tokens_per_s']:,.0f} tok/s",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", nargs="*", default=["small", "gpt2"], choices=list(SIZES))
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: by size)")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None, help="rounds per size (default: by size)")
    p.add_argument("--autocast", action="store_true", help="also time bf16 autocast")
    p.add_argument("--quality", type=Path, help="activation file for the fp32/bf16 comparison")
    p.add_argument("--model-dir", type=Path, help="model directory for --quality")
    p.add_argument("--quality-tokens", type=int, default=300_000)
    args = p.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = measured_peak_flops(args.device)
    print(
        f"device={args.device} threads={torch.get_num_threads()} "
        f"measured peak matmul {peak / 1e9:.1f} GFLOP/s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes:
            steps = args.steps or (100 if name == "small" else 3)
            rounds = args.rounds or (4 if name == "small" else 1)
            for autocast in (False, True) if args.autocast else (False,):
                bench(name, steps, args.batch, args.device, Path(tmp), peak, rounds, autocast)
        if args.quality:
            if not args.model_dir:
                p.error("--quality needs --model-dir")
            quality(args.quality, args.model_dir, args.quality_tokens, args.device, Path(tmp))


if __name__ == "__main__":
    main()
