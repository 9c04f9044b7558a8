#!/usr/bin/env python
"""The GPU benchmark suite: capture, SAE training and attribution on GPT-2 small and
Qwen2.5-0.5B architectures (random weights, no download) on the device it finds.

    python benchmarks/gpu_suite.py                       # cuda if present, else cpu
    python benchmarks/gpu_suite.py --small               # tiny sizes: a smoke test (< 1 minute)
    python benchmarks/gpu_suite.py --device cpu --models gpt2-small --out /tmp/cpu.json

Prints one line per stage and model (rate, peak memory against the memory plan, share of the
compute roofline, ratio to the bare forward pass) and writes them as JSON to
benchmarks/results/<device>.json; `python -m circuitflow.gpu_hours` turns that into the
GPU-hours of a full CSD3 run. See src/circuitflow/gpu_suite.py for what each stage runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once

from circuitflow import gpu_suite  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default=gpu_suite.default_device(), help="cuda, cuda:1 or cpu")
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
    if args.device.startswith("cuda") and not gpu_suite.torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is visible")
    if args.threads:
        gpu_suite.torch.set_num_threads(args.threads)
    if args.small:
        sizes, mode = gpu_suite.SMALL_SIZES, "small"
    elif args.device.startswith("cuda"):
        sizes, mode = gpu_suite.GPU_SIZES, "full"
    else:
        sizes, mode = gpu_suite.CPU_SIZES, "full shapes, reduced work (CPU)"
    overrides = {
        "capture_tokens": args.capture_tokens,
        "sae_steps": args.sae_steps,
        "sae_batch": args.sae_batch,
        "attribution_prompts": args.prompts,
    }
    sizes = dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v})
    if sizes.sae_steps < 2:
        p.error("--sae-steps: at least 2 (the first step is not timed)")
    result = gpu_suite.run(args.models, args.device, sizes, mode)
    out = gpu_suite.write(result, args.out or gpu_suite.result_path(args.device))
    print(f"wrote {out} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
