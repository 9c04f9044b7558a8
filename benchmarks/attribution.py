#!/usr/bin/env python
"""Attribution's fast pass (atp) on a GPT-2-small-architecture model with a TopK SAE on every
layer (random weights, no download): today's code and this checkout's, side by side.

    python benchmarks/attribution.py                  # CPU: 2 layers, reduced sizes (~3 min)
    python benchmarks/attribution.py --device cuda --json benchmarks/results/attribution-h200.json

Each code tree runs in its own process (`--baseline-ref`, default main, exported with `git
archive`; this checkout's `src/` for the new one), alternating, `--rounds` times, as the stage
runs it: scores.score_nodes in float32 without TF32 (attribution/stage.py says why), `atp`,
the validation prompts' gradients kept, exact patching left out of the timing. Per tree:

- tokens/s of the fast pass, the best of its rounds, timed on a GPU by CUDA events recorded
  where the pass starts and ends (no synchronisation added inside it), on a CPU by the clock;
- per batch, counted over the pass on the first batches: reads of a device value back
  (tests/helpers/no_sync.py's ops on a CPU; on a GPU, torch's own sync debug mode), copies to
  the host (on a GPU every device-to-host copy; on a CPU the copies the code asks to the host:
  `.to("cpu")` and non-blocking copies into host memory) and SAE decodes;
- the FLOPs it ran (torch's FlopCounterMode: every matmul, forward and backward) and their
  share of the peak of the dtype they ran in: float32 without TF32, measured here as the best
  of the pass's two largest matmuls ([batch x positions, d_model] x [d_model, d_sae] and
  x [d_model, d_vocab]).

Every figure goes into the JSON (`--json`) as soon as it is measured. On a GPU the summary sets
the new rate against the target: 10 x 2,324 tokens/s, the rate of the H200 run of 2026-11-27
(benchmarks/results/gpu_suite-nvidia-h200-cuda.json, which ran the model in bf16 and the SAEs
with TF32: not what the stage runs; today's code at the stage's precision runs here beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import trees

REPO = Path(__file__).resolve().parents[1]
TARGET_BASE = 2324.2  # tokens/s: gpu_suite-nvidia-h200-cuda.json, attribution "atp, 12 SAEs"
SIZES = {
    # GPT-2 small, an SAE (TopK, 32x, k 32) on every layer, as the GPU suite measured.
    "gpt2": dict(
        layers=12, d_sae=24576, k=32, prompts=128, length=16, batch=64, validation=32, rounds=2
    ),
    # The same widths on 2 layers and 4x SAEs: a CPU's minutes.
    "small": dict(
        layers=2, d_sae=3072, k=32, prompts=16, length=16, batch=8, validation=4, rounds=2
    ),
}


# --- the worker: one code tree, one process --------------------------------------------------
def worker(args) -> dict:
    import numpy as np
    import pandas as pd
    import torch
    from sae_lens import TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from torch.utils.flop_counter import FlopCounterMode
    from transformer_lens import HookedTransformer

    import circuitflow
    from circuitflow import perf
    from circuitflow.attribution import scores
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.devices import precise_math
    from circuitflow.model import architectures
    from circuitflow.nodes import hook_name

    sys.path.insert(0, str(REPO / "tests"))
    from helpers.no_sync import NoHostSync

    device, cuda = args.device, args.device.startswith("cuda")
    torch.manual_seed(0)
    cfg = architectures.config("gpt2-small", device=device, dtype=torch.float32, seed=0,
                               n_layers=args.layers)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    saes = {}
    for layer in range(cfg.n_layers):
        sae_cfg = TopKSAEConfig(
            d_in=cfg.d_model,
            d_sae=args.d_sae,
            k=args.k,
            device=device,
            metadata=SAEMetadata(hook_name=hook_name("resid_post", layer)),
        )
        saes[sae_cfg.metadata.hook_name] = TopKSAE(sae_cfg).eval().requires_grad_(False)
    rng = np.random.default_rng(1)
    n, t = args.prompts, args.length
    clean = rng.integers(1, cfg.d_vocab, (n, t))
    corrupted = clean.copy()
    corrupted[:, 1 : t // 2] = rng.integers(1, cfg.d_vocab, (n, t // 2 - 1))
    prompts = pd.DataFrame({
        "prompt_id": np.arange(n), "clean_tokens": list(clean),
        "corrupted_tokens": list(corrupted), "answer_id": rng.integers(1, cfg.d_vocab, n),
        "distractor_id": rng.integers(1, cfg.d_vocab, n),
    })  # fmt: skip
    acfg = AttributionConfig(method="atp", validation_heads=0, validation_features=0,
                             validation_prompts=args.validation, batch_size=args.batch)  # fmt: skip

    # The fast pass is the PassCounter part named after the method, in both trees: what is
    # measured runs inside it.
    inside: list[contextlib.AbstractContextManager] = []
    part = perf.PassCounter.part
    in_pass = [False]

    @contextlib.contextmanager
    def measured_part(self, name):
        with part(self, name), contextlib.ExitStack() as stack:
            if name == "atp":
                for cm in inside:
                    stack.enter_context(cm)
                in_pass[0] = True
            try:
                yield
            finally:
                in_pass[0] = False

    perf.PassCounter.part = measured_part
    try:
        decodes = [0]
        for sae in saes.values():
            decode = sae.decode

            def counted(x, decode=decode):
                decodes[0] += in_pass[0]
                return decode(x)

            sae.decode = counted

        with precise_math():
            scores.score_nodes(model, prompts.iloc[: args.batch], saes, acfg)  # warm-up
            # Counts over the first two batches (the first holds the validation rows).
            two = prompts.iloc[: 2 * args.batch]
            batches = -(-len(two) // args.batch)
            copies, flops = HostCopies(cuda), FlopCounterMode(display=False)
            syncs = NoHostSync(record=True)
            inside[:] = [copies, flops] + ([] if cuda else [syncs])
            decodes[0] = 0
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                scores.score_nodes(model, two, saes, acfg)
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
            inside.clear()
            n_syncs = (
                sum("synchronizing" in str(w.message) for w in caught) if cuda else len(syncs.found)
            )
            counts = {
                "syncs_per_batch": n_syncs / batches,
                "host_copies_per_batch": copies.count / batches,
                "host_copy_bytes_per_batch": copies.bytes / batches,
                "decodes_per_batch": decodes[0] / batches,
                "flops_per_token": flops.get_total_flops() / (len(two) * t),
            }
            # Timing: the fast pass, CUDA events (or the clock) at its start and end.
            seconds = []
            for _ in range(args.repeats):
                clock = PassClock(cuda)
                inside[:] = [clock]
                scores.score_nodes(model, prompts, saes, acfg)
                inside.clear()
                seconds.append(clock.seconds())
    finally:
        perf.PassCounter.part = part
    best = min(seconds)
    return {
        "src": str(Path(circuitflow.__file__).parents[1]),
        "tokens_per_s": n * t / best,
        "seconds": seconds,
        **counts,
    }


class HostCopies:
    """Counts copies to the host (see the module doc) under a TorchDispatchMode."""

    def __init__(self, cuda: bool):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer, self.cuda = self, cuda

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                outer.see(func, args, kwargs)
                return func(*args, **kwargs)

        self.mode, self.count, self.bytes = Mode(), 0, 0

    def see(self, func, args, kwargs) -> None:
        import torch

        name = func.overloadpacket.__name__
        if name == "_to_copy":
            src, to = args[0], kwargs.get("device")
            hit = to is not None and torch.device(to).type == "cpu"
            hit = hit and (src.device.type != "cpu" or not self.cuda)
        elif name == "copy_":
            dst, src = args[0], args[1]
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            hit = dst.device.type == "cpu" and isinstance(src, torch.Tensor)
            hit = hit and (src.device.type != "cpu" if self.cuda else not blocking)
        else:
            return
        if hit:
            self.count += 1
            self.bytes += src.numel() * src.element_size()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


class PassClock:
    """The pass's time: CUDA events recorded at its start and end on a GPU (the host does not
    wait for the device until the end), the clock on a CPU."""

    def __init__(self, cuda: bool):
        import torch

        self.cuda = cuda
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else []
        self.t = [0.0, 0.0]

    def __enter__(self):
        if self.cuda:
            self.events[0].record()
        self.t[0] = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.events[1].record()
        self.t[1] = time.perf_counter()

    def seconds(self) -> float:
        if self.cuda:
            self.events[1].synchronize()
            return self.events[0].elapsed_time(self.events[1]) / 1e3
        return self.t[1] - self.t[0]


# --- the parent: both trees, side by side -----------------------------------------------------
def peak_flops(device: str, m: int, k: int, n: int, reps: int = 10) -> float:
    """FLOP/s of a float32 matmul without TF32 at [m, k] x [k, n], the best of 3 rounds."""
    import torch

    from circuitflow.devices import precise_math

    a = torch.randn(m, k, device=device)
    b = torch.randn(k, n, device=device)
    best = 0.0
    with precise_math():
        a @ b
        for _ in range(3):
            clock = PassClock(device.startswith("cuda"))
            with clock:
                for _ in range(reps):
                    a @ b
            best = max(best, 2 * m * k * n * reps / clock.seconds())
    return best


def run_worker(src: Path, args) -> dict:
    args_ = ["--device", args.device, "--repeats", str(args.repeats)]
    for key in ("layers", "d_sae", "k", "prompts", "length", "batch", "validation"):
        args_ += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return trees.run_worker(__file__, src, args_)


def summary(data: dict, cuda: bool) -> dict:
    out = {}
    for tree, runs in data["runs"].items():
        if runs:
            best = max(runs, key=lambda r: r["tokens_per_s"])
            achieved = best["flops_per_token"] * best["tokens_per_s"]
            out[tree] = {
                "tokens_per_s": best["tokens_per_s"],
                "share_of_float32_peak": achieved / data["peak_flops_float32"],
                **{k: best[k] for k in best if k.endswith("_per_batch") or k == "flops_per_token"},
            }
    if "today" in out and "new" in out:
        out["speedup"] = out["new"]["tokens_per_s"] / out["today"]["tokens_per_s"]
    if cuda and "new" in out:
        out["target_tokens_per_s"] = 10 * TARGET_BASE
        out["vs_target"] = out["new"]["tokens_per_s"] / (10 * TARGET_BASE)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", choices=sorted(SIZES), default=None, help="gpt2 on a GPU")
    for key in ("layers", "d_sae", "k", "prompts", "length", "batch", "validation", "rounds"):
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes a process")
    parsed = trees.parse(ap, worker)
    if parsed is None:
        return
    args, cuda = parsed
    import torch

    sizes = SIZES[args.sizes or ("gpt2" if cuda else "small")]
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    data = {
        "benchmark": "attribution fast pass (atp), today's code and this checkout's",
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "sizes": {k: getattr(args, k) for k in sizes},
        "dtype": "float32 (no TF32)",
        "baseline_ref": args.baseline_ref,
        "runs": {"today": [], "new": []},
    }
    d_model = 768
    # The pass's two largest products: an SAE's encoder and the unembedding, a batch's tokens.
    rows = args.batch * args.length
    data["peak_flops_float32"] = max(
        peak_flops(args.device, rows, d_model, n) for n in (args.d_sae, 50257)
    )
    trees.write(args.json, data)
    print(f"float32 (no TF32) matmul peak: {data['peak_flops_float32'] / 1e12:.3g} TFLOP/s")
    with tempfile.TemporaryDirectory() as tmp:
        code = trees.trees(args.baseline_ref, Path(tmp), data)
        for _ in range(args.rounds):
            for tree, src in code:
                result = run_worker(src, args)
                data["runs"][tree].append(result)
                data["summary"] = summary(data, cuda)
                trees.write(args.json, data)
                print(f"{tree:5s} {result['tokens_per_s']:10,.0f} tokens/s  "
                      f"syncs/batch {result['syncs_per_batch']:.1f}  "
                      f"host copies/batch {result['host_copies_per_batch']:.1f}  "
                      f"decodes/batch {result['decodes_per_batch']:.1f}", flush=True)  # fmt: skip
    print(json.dumps(data["summary"], indent=2))


if __name__ == "__main__":
    main()
