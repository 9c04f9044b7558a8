#!/usr/bin/env python
"""The cross-layer transcoder's training step (sae.cross_layer_train) on one device: tokens/s,
its share of the measured float32 (TF32 on CUDA) matmul peak, and on CUDA the step,
its backward and Adam under torch.cuda.set_sync_debug_mode("error") (the CPU proof is
tests/sae/test_cross_layer_train.py's NoHostSync test). AuxK is on (half the features dead),
as in a long run's steady state; the data is random (the step's cost does not depend on it).

    python benchmarks/clt_train.py --device cuda --json benchmarks/results/clt_train-cuda.json
    python benchmarks/clt_train.py --device cpu --layers 2 --d-model 16 --features 32 --steps 3

FLOPs a token (dense, as the step computes them): the encoders 2 L D F, the decoders into every
later layer 2 (L (L + 1) / 2) F D, AuxK's decoders as many again; the backward twice the
forward. Timing: CUDA events after the first step and after the last (nothing synchronised per
step), the wall clock on CPU. Every figure is written to --json as soon as it is measured.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from circuitflow import perf
from circuitflow.io import write_json


def flops_per_token(n_layers: int, d_model: int, features: int) -> float:
    encode = 2 * n_layers * d_model * features
    decode = 2 * (n_layers * (n_layers + 1) // 2) * features * d_model
    return 3 * (encode + 2 * decode)  # forward (AuxK's decode too) and a backward of twice it


def main() -> None:
    from circuitflow.sae.cross_layer_train import CLTShard, CLTTrainConfig, training_step

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=12)  # GPT-2 small's shape
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--features", type=int, default=8192, help="a layer")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    L, D, F = a.layers, a.d_model, a.features  # noqa: N806
    cfg = CLTTrainConfig(d_transcoder=F, activation="topk", k=a.k, seed=0)
    shard = CLTShard(L, D, cfg).to(a.device)
    fused = {"fused": True} if a.device.startswith("cuda") else {}
    opt = torch.optim.Adam(shard.parameters(), lr=1e-4, **fused)
    g = torch.Generator(device=a.device).manual_seed(0)
    x = torch.randn(a.batch, L, D, device=a.device, generator=g)
    y = torch.randn(a.batch, L, D, device=a.device, generator=g)
    dead = torch.zeros(L, F, dtype=torch.bool, device=a.device)
    dead[:, ::2] = True
    out = {
        "what": "CLT training step (sae.cross_layer_train), TopK with AuxK, float32 masters",
        "device": a.device,
        "name": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
        "shape": {"layers": L, "d_model": D, "features_a_layer": F, "k": a.k,
                  "batch_tokens": a.batch, "steps": a.steps},
        "compute_dtype": "tf32" if a.device.startswith("cuda") else "float32",
        "flops_per_token": flops_per_token(L, D, F),
    }  # fmt: skip
    write_json(a.json, out)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss, _ = training_step(shard, x, y, dead)
        loss.backward()
        opt.step()

    step()  # the first: allocations, kernels chosen
    perf.synchronize(a.device)
    t0 = time.perf_counter()
    if a.device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(a.steps):
            step()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000
    else:
        for _ in range(a.steps):
            step()
        seconds = time.perf_counter() - t0
    out["tokens_per_s"] = a.batch * a.steps / seconds
    out["peak_flops"] = perf.measured_peak_flops(a.device)  # float32; TF32 where allowed
    out["share_of_peak"] = perf.roofline_share(
        out["flops_per_token"], out["tokens_per_s"], out["peak_flops"]
    )
    if a.device.startswith("cuda"):
        out["memory_peak_bytes"] = torch.cuda.max_memory_allocated()
    write_json(a.json, out)
    if a.device.startswith("cuda"):
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(2):
                step()
            out["sync_check"] = {"passed": True}
        except RuntimeError as err:
            out["sync_check"] = {"passed": False, "error": str(err).splitlines()[0]}
        finally:
            torch.cuda.set_sync_debug_mode("default")
        write_json(a.json, out)
    print(f"CLT step {L}x{D}x{F}: {out['tokens_per_s']:,.0f} tokens/s, "
          f"{out['share_of_peak']:.2f} of the matmul peak")  # fmt: skip


if __name__ == "__main__":
    main()
