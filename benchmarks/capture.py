#!/usr/bin/env python
"""Activation capture against the disk it writes to: today's code and this checkout's, side by
side, with the disk's own write rate measured between them.

    python benchmarks/capture.py                      # CPU: small models (~2 minutes)
    python benchmarks/capture.py --device cuda --json benchmarks/results/capture-h200.json

For each model size (random weights, no download): a GPT-2-small-architecture model (12 layers
on a GPU, 2 on a CPU) and one of the embedded default's size, every layer's resid_post hooked,
float16 rows, the model in the dtype the stage picks (`model.dtype: auto`: bf16 on the GPU).
Each code tree (`--baseline-ref`, default main, exported with `git archive`; this checkout's
`src/`) runs capture.stage.capture in its own process, alternating with the other and with a
plain fsync'd write of the same size in the same directory (the disk's rate), `--rounds`
times. Figures per tree and size, the best round each: tokens/s, bytes/s written and their
share of the disk's rate (the target on a GPU: at least 80%), the bare forward's tokens/s (no
hooks, no writes: the ceiling compute sets) and the forward's share of the matmul peak of the
model's dtype, measured here at the forward's MLP shape. Every figure goes into the JSON
(`--json`) as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import trees

REPO = Path(__file__).resolve().parents[1]
TARGET_SHARE = 0.8  # of the disk's write rate, on a GPU (issue 46)
EMBEDDED = dict(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256, n_ctx=32, d_vocab=102)
SIZES = {
    # name: (model, layers (None: all), tokens, context, batch (None: the memory plan's))
    # 131072 rows of 12 hooks: 2.4 GB a run (the GPU suite's size; the disk holds a few).
    "cuda": {"gpt2": ("gpt2", None, 131072, 128, None)},
    "cpu": {"embedded": ("embedded", None, 131072, 32, 256), "gpt2": ("gpt2", 2, 8192, 128, 8)},
}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def build(model: str, layers: int | None, device: str):
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuitflow.devices import resolve_dtype
    from circuitflow.model import architectures

    dtype = resolve_dtype("auto", device.split(":")[0])
    if model == "embedded":
        cfg = HookedTransformerConfig(**EMBEDDED, act_fn="gelu_new", normalization_type="LN",
                                      device=device, seed=0, dtype=dtype)  # fmt: skip
    else:
        extra = {"n_layers": layers} if layers else {}
        cfg = architectures.config("gpt2-small", device=device, dtype=dtype, seed=0, **extra)
    torch.manual_seed(0)
    return HookedTransformer(cfg).eval()


def worker(args) -> dict:
    """One tree, one size: the capture (twice: a warm-up, then timed) and the bare forward."""
    import numpy as np
    import torch

    import circuitflow
    from circuitflow.capture.config import CaptureConfig
    from circuitflow.capture.stage import capture

    device = args.device
    model = build(args.model, args.layers or None, device)
    rng = np.random.default_rng(0)
    ctx = args.context
    tokens = rng.integers(1, model.cfg.d_vocab, size=(args.tokens // (ctx - 1) + 1, ctx))
    tokens[:, 0] = 0
    tokens = tokens.astype(np.int32)
    work = Path(args.dir)
    targets = {("resid_post", n): work / f"layer_{n}.h5" for n in range(model.cfg.n_layers)}
    meta = {"model_hash": "bench", "token_set_hash": "bench", "bos_token_id": 0}
    opts = CaptureConfig(dtype="float16", batch_size=args.batch or None)

    def run(contexts):
        for p in targets.values():
            p.unlink(missing_ok=True)
        return capture(model, contexts, meta, targets, opts, progress=False)

    run(tokens[: max(1, len(tokens) // 16)])  # warm-up: kernels, allocator, pinned memory
    result = run(tokens)
    for p in targets.values():
        p.unlink(missing_ok=True)
    batch = result.batch_size
    sync(device)
    with torch.inference_mode():
        x = torch.from_numpy(tokens[:batch].astype(np.int64)).to(device)
        model(x, stop_at_layer=model.cfg.n_layers)
        sync(device)
        t0 = time.perf_counter()
        for a in range(0, len(tokens), batch):
            x = torch.from_numpy(tokens[a : a + batch].astype(np.int64)).to(device)
            model(x, stop_at_layer=model.cfg.n_layers)
        sync(device)
        forward = time.perf_counter() - t0
    return {
        "src": str(Path(circuitflow.__file__).parents[1]),
        "tokens_per_s": tokens.size / result.seconds,
        "bytes_per_s": result.bytes_written / result.seconds,
        "bytes_written": result.bytes_written,
        "seconds": result.seconds,
        "batch_size": batch,
        "forward_tokens_per_s": tokens.size / forward,
        "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }


def disk_write_rate(directory: Path, n_bytes: int) -> float:
    """Bytes/s of one sequential write of `n_bytes` in 64 MiB blocks, fsync'd."""
    block = os.urandom(1 << 20) * 64
    path = directory / "disk_speed.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        written = 0
        while written < n_bytes:
            fh.write(block)
            written += len(block)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return written / seconds


def matmul_peak(device: str, dtype_name: str, m: int, k: int, n: int) -> float:
    """FLOP/s of an [m, k] x [k, n] matmul in `dtype_name`, the best of 3 rounds."""
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = (
        torch.randn(m, k, device=device, dtype=dtype),
        torch.randn(k, n, device=device, dtype=dtype),
    )
    a @ b
    best = 0.0
    for _ in range(3):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        sync(device)
        best = max(best, 20 * m * k * n / (time.perf_counter() - t0))
    return best


def run_worker(src: Path, size: tuple, args, work: Path) -> dict:
    model, layers, tokens, context, batch = size
    return trees.run_worker(__file__, src, [
        "--device", args.device, "--model", model, "--layers", str(layers or 0),
        "--tokens", str(tokens), "--context", str(context), "--batch", str(batch or 0),
        "--dir", str(work),
    ])  # fmt: skip


def summarise(data: dict, cuda: bool) -> dict:
    from circuitflow.model import architectures
    from circuitflow.model.flops import forward_flops_per_token

    out = {}
    disk = max(data["disk_bytes_per_s"], default=float("nan"))
    for name, by_tree in data["runs"].items():
        out[name] = {}
        for tree, runs in by_tree.items():
            if not runs:
                continue
            best = max(runs, key=lambda r: r["bytes_per_s"])
            row = {k: best[k] for k in ("tokens_per_s", "bytes_per_s", "forward_tokens_per_s")}
            row["share_of_disk"] = best["bytes_per_s"] / disk
            size = data["sizes"][name]
            size = (size["model"], size["layers"], size["tokens"], size["context"], size["batch"])
            if size[0] == "gpt2":
                cfg = architectures.config(
                    "gpt2-small", **({"n_layers": size[1]} if size[1] else {})
                )
                flops = forward_flops_per_token(cfg, size[3], cfg.n_layers, unembed=False)
                peak = data["peak_flops"][best["model_dtype"]]
                row["forward_share_of_peak"] = flops * best["forward_tokens_per_s"] / peak
                row["capture_share_of_peak"] = flops * best["tokens_per_s"] / peak
            out[name][tree] = row
        if "today" in out[name] and "new" in out[name]:
            out[name]["speedup"] = (
                out[name]["new"]["bytes_per_s"] / out[name]["today"]["bytes_per_s"]
            )
        if cuda and "new" in out[name]:
            out[name]["target_share_of_disk"] = TARGET_SHARE
            out[name]["meets_target"] = out[name]["new"]["share_of_disk"] >= TARGET_SHARE
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="this share of each size's tokens")
    ap.add_argument("--dir", default=None, help="where files go (default: a temp dir here)")
    for key, kind in (("model", str), ("layers", int), ("tokens", int), ("context", int),
                      ("batch", int)):  # fmt: skip
        ap.add_argument(f"--{key}", type=kind, help=argparse.SUPPRESS)
    parsed = trees.parse(ap, worker)
    if parsed is None:
        return
    args, cuda = parsed
    import torch

    sizes = {
        name: (m, layers, int(tokens * args.scale), ctx, batch)
        for name, (m, layers, tokens, ctx, batch) in SIZES["cuda" if cuda else "cpu"].items()
    }
    data = {
        "benchmark": "capture against the disk, today's code and this checkout's",
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "sizes": {
            k: dict(zip(("model", "layers", "tokens", "context", "batch"), v, strict=True))
            for k, v in sizes.items()
        },  # fmt: skip
        "baseline_ref": args.baseline_ref,
        "disk_bytes_per_s": [],
        "runs": {name: {"today": [], "new": []} for name in sizes},
    }
    dtype = "bfloat16" if cuda else "float32"
    data["peak_flops"] = {dtype: matmul_peak(args.device, dtype, 256 * 128, 768, 3072)}
    trees.write(args.json, data)
    with tempfile.TemporaryDirectory(dir=args.dir or ".") as tmp:
        work = Path(tmp)
        code = trees.trees(args.baseline_ref, work, data)
        for _ in range(args.rounds):
            for name, size in sizes.items():
                for tree, src in code:
                    result = run_worker(src, size, args, work)
                    data["runs"][name][tree].append(result)
                    disk = disk_write_rate(work, result["bytes_written"])
                    data["disk_bytes_per_s"].append(disk)
                    data["summary"] = summarise(data, cuda)
                    trees.write(args.json, data)
                    print(f"{name:9s} {tree:5s} {result['tokens_per_s']:12,.0f} tokens/s "
                          f"{result['bytes_per_s'] / 1e6:8.1f} MB/s (disk {disk / 1e6:,.0f} MB/s) "
                          f"forward {result['forward_tokens_per_s']:12,.0f} tokens/s",
                          flush=True)  # fmt: skip
    print(json.dumps(data["summary"], indent=2))


if __name__ == "__main__":
    main()
