"""Activation capture throughput: bare forward pass vs circuitflow's capture, and disk speed.

    python benchmarks/capture.py                              # CPU default, under ~2 minutes
    python benchmarks/capture.py --tokens 262144 --gpt2-tokens 65536 --device cuda

On the same tokens and batch size, for a model of the embedded default's size and one of GPT-2
small's architecture (random weights, no download): tokens/s of a bare forward pass (no hooks,
no writes; `stop_at_layer` as capture uses it), tokens/s of the capture stage (hooks at every
layer's resid_post, HDF5 writes, checkpoints), and their time ratio; then the disk's sequential
write speed (one large plain write, fsync'd) next to the bytes/s capture wrote.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuitflow.capture.config import CaptureConfig
from circuitflow.capture.stage import capture
from circuitflow.model import architectures

EMBEDDED = dict(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256, n_ctx=32, d_vocab=102)
FIELDS = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab")
GPT2 = {k: getattr(architectures.gpt2_small(), k) for k in FIELDS}


def make_model(dims: dict, device: str) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        **dims, act_fn="gelu_new", normalization_type="LN", device=device, seed=0
    )
    return HookedTransformer(cfg).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bare_forward(model, tokens: np.ndarray, batch: int, stop_at: int, device: str) -> float:
    """Seconds for a hook-free forward over all contexts."""
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for a in range(0, len(tokens), batch):
            x = torch.from_numpy(np.asarray(tokens[a : a + batch], dtype=np.int64)).to(device)
            model(x, stop_at_layer=stop_at)
    sync(device)
    return time.perf_counter() - t0


def run_capture(model, tokens, batch, dtype, workdir: Path, device: str):
    meta = {"model_hash": "bench", "token_set_hash": "bench", "bos_token_id": 0}
    n_layers = model.cfg.n_layers
    targets = {("resid_post", layer): workdir / f"layer_{layer}.h5" for layer in range(n_layers)}
    opts = CaptureConfig(dtype=dtype, batch_size=batch)
    sync(device)
    t0 = time.perf_counter()
    result = capture(model, tokens, meta, targets, opts, progress=False)
    sync(device)
    seconds = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in targets.values())
    for p in targets.values():
        p.unlink()
    return seconds, result, size


def disk_write_speed(workdir: Path, n_bytes: int) -> float:
    """Bytes/s of one large sequential write, fsync'd, in 64 MiB blocks."""
    block = os.urandom(1 << 20) * 64
    path = workdir / "disk_speed.bin"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=65536, help="embedded-sized model tokens")
    parser.add_argument("--gpt2-tokens", type=int, default=2048, help="GPT-2-small tokens")
    parser.add_argument("--gpt2-context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256, help="embedded-sized batch (contexts)")
    parser.add_argument("--gpt2-batch", type=int, default=8)
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    parser.add_argument("--disk-mb", type=int, default=512, help="size of the plain disk write")
    parser.add_argument("--dir", default=None, help="where files go (default: a temp dir here)")
    parser.add_argument("--sizes", default="embedded,gpt2")
    parser.add_argument("--repeats", type=int, default=2, help="best of N for each timing")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, storage {args.dtype}")
    header = f"{'model':<10} {'tokens':>8} {'forward tok/s':>14} {'capture tok/s':>14} "
    header += f"{'capture/forward time':>21} {'capture MB/s':>13}"
    rows, capture_rates = [], []
    with tempfile.TemporaryDirectory(dir=args.dir or ".") as tmp:
        work = Path(tmp)
        for size in args.sizes.split(","):
            dims = EMBEDDED if size == "embedded" else GPT2
            ctx = dims["n_ctx"] if size == "embedded" else args.gpt2_context
            n_tok = args.tokens if size == "embedded" else args.gpt2_tokens
            batch = args.batch if size == "embedded" else args.gpt2_batch
            model = make_model(dims, args.device)
            tokens = rng.integers(1, dims["d_vocab"], size=(n_tok // (ctx - 1) + 1, ctx))
            tokens[:, 0] = 0
            tokens = tokens.astype(np.int32)
            bare_forward(model, tokens[: batch * 2], batch, dims["n_layers"], args.device)  # warm
            # Alternate the two and keep each one's best: the machine may be shared.
            t_fwd = t_cap = float("inf")
            for _ in range(args.repeats if size == "embedded" else 1):
                t_fwd = min(
                    t_fwd, bare_forward(model, tokens, batch, dims["n_layers"], args.device)
                )
                t, result, _ = run_capture(model, tokens, batch, args.dtype, work, args.device)
                t_cap = min(t_cap, t)
            n = tokens.size
            rate = result.bytes_written / t_cap
            capture_rates.append(rate)
            rows.append(
                f"{size:<10} {n:>8} {n / t_fwd:>14.0f} {n / t_cap:>14.0f} "
                f"{t_cap / t_fwd:>21.2f} {rate / 1e6:>13.1f}"
            )
            del model
        disk = disk_write_speed(work, args.disk_mb << 20)
    print(header)
    print("\n".join(rows))
    print(
        f"disk sequential write {disk / 1e6:.0f} MB/s (fsync'd); capture wrote "
        + ", ".join(f"{r / 1e6:.1f} MB/s ({r / disk:.0%} of disk)" for r in capture_rates)
    )


if __name__ == "__main__":
    main()
