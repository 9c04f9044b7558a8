"""SAE training throughput: circuitflow's stage vs plain SAELens vs the roofline.

    python benchmarks/sae_train.py                 # CPU default: small + GPT-2-small sized
    python benchmarks/sae_train.py --sizes gpt2 --steps 200 --device cuda

Both paths train the same TopK SAE config with SAELens's SAETrainer on the same activations;
circuitflow streams them from HDF5 (shuffle buffer, prefetch thread), the baseline is the
in-memory iterator a SAELens user would write. Roofline = FLOPs/token x measured peak matmul rate.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sae_lens.config import SAETrainerConfig
from sae_lens.training.sae_trainer import SAETrainer

from circuitflow.sae_data import (
    ActivationStream,
    ActivationStreamConfig,
    read_activation_info,
    write_activation_file,
)
from circuitflow.sae_training import ControlledSAETrainer, SAETrainConfig, build_training_sae

SIZES = {"small": (64, 8, 16), "gpt2": (768, 32, 32)}  # d_in, expansion, k


def peak_flops(device: str, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t)


def time_fit(trainer: SAETrainer, steps: int, batch: int, device: str) -> float:
    t = time.perf_counter()
    trainer.fit()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t)


def bench(name: str, steps: int, batch: int, device: str, tmp: Path, peak: float) -> None:
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
    )
    hook = "blocks.0.hook_resid_post"

    info = read_activation_info(path)
    torch.manual_seed(0)
    with ActivationStream(info, ActivationStreamConfig(batch_size=batch, device=device)) as s:
        ours = time_fit(
            ControlledSAETrainer(
                cfg=tcfg, sae=build_training_sae(cfg, d_in, hook, device), data_provider=s
            ),
            steps,
            batch,
            device,
        )

    data = torch.from_numpy(acts.astype(np.float32)).to(device)

    def in_memory():
        g = torch.Generator(device="cpu").manual_seed(0)
        while True:
            yield data[torch.randint(0, n_rows, (batch,), generator=g).to(device)]

    torch.manual_seed(0)
    base = time_fit(
        SAETrainer(
            cfg=tcfg, sae=build_training_sae(cfg, d_in, hook, device), data_provider=in_memory()
        ),
        steps,
        batch,
        device,
    )
    d_sae = d_in * exp
    # Encoder + dense decoder matmuls, forward and backward (x3): 12 * d_in * d_sae per token.
    roof = peak / (12 * d_in * d_sae)
    print(
        f"{name:6s} d_in={d_in:4d} d_sae={d_sae:6d} k={k:3d} batch={batch}: "
        f"circuitflow {ours:11,.0f} tok/s | SAELens in-memory {base:11,.0f} tok/s | "
        f"roofline {roof:13,.0f} tok/s | ours/SAELens {ours / base:.2f} | "
        f"ours/roofline {ours / roof:.3f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", nargs="+", default=["small", "gpt2"], choices=list(SIZES))
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: by size)")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = peak_flops(args.device)
    print(
        f"device={args.device} threads={torch.get_num_threads()} "
        f"measured peak matmul {peak / 1e9:.1f} GFLOP/s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes:
            steps = args.steps or (200 if name == "small" else 6)
            bench(name, steps, args.batch, args.device, Path(tmp), peak)


if __name__ == "__main__":
    main()
