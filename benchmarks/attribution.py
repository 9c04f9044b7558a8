#!/usr/bin/env python
"""Time the attribution stage on a random-weight GPT-2-small-architecture model with random SAEs
and extrapolate to GPT-2 small, 12 SAEs, 256 prompts on an A100.

Estimate method: measure seconds per prompt for each part (fast method, exact patching of
heads/MLPs, edges) on this machine with `--n-saes` SAEs on resid_post; count the FLOPs of one
forward pass (model.flops.attribution_forward_flops_per_prompt: the blocks, the unembedding and each
SAE's encode and two decodes) and measure this machine's
achieved FLOP/s on the same forward; the A100 time is measured_time x (cpu FLOP/s / A100 FLOP/s)
with the A100 at an assumed 40% of 156 TFLOP/s TF32 (small batches, hook overhead). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--n-saes", type=int, default=12)
    ap.add_argument("--d-sae", type=int, default=6144)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--method", default="atp")
    ap.add_argument("--target-prompts", type=int, default=256)
    args = ap.parse_args()
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from transformer_lens import HookedTransformer

    from circuitflow import perf
    from circuitflow.attribution import scores as attr
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.model import architectures
    from circuitflow.model.flops import attribution_forward_flops_per_prompt
    from circuitflow.nodes import hook_name

    torch.manual_seed(0)
    cfg = architectures.gpt2_small(n_layers=args.layers)
    model = HookedTransformer(cfg).eval()
    saes = {}
    for layer in range(min(args.n_saes, args.layers)):
        hook = hook_name("resid_post", layer)
        sae = StandardSAE(
            StandardSAEConfig(
                d_in=cfg.d_model, d_sae=args.d_sae, metadata=SAEMetadata(hook_name=hook)
            )
        ).eval()
        saes[hook] = sae
    rng = np.random.default_rng(0)
    clean = rng.integers(0, cfg.d_vocab, (args.n_prompts, args.seq))
    corr = clean.copy()
    corr[:, : args.seq // 2] = rng.integers(0, cfg.d_vocab, (args.n_prompts, args.seq // 2))
    prompts = pd.DataFrame(
        {
            "prompt_id": np.arange(args.n_prompts),  # the selection/held-out halves
            "clean_tokens": list(clean),
            "corrupted_tokens": list(corr),
            "answer_id": rng.integers(0, cfg.d_vocab, args.n_prompts),
            "distractor_id": rng.integers(0, cfg.d_vocab, args.n_prompts),
        }
    )
    acfg = AttributionConfig(
        method=args.method,
        validation_features=0,
        batch_size=args.n_prompts,
        ig_steps=10,
    )
    t0 = time.perf_counter()
    scores = attr.score_nodes(model, prompts, saes, acfg)
    total = time.perf_counter() - t0
    # Achieved CPU FLOP/s on one plain forward.
    tokens = torch.tensor(clean)
    with torch.no_grad():
        model(tokens)
        t1 = time.perf_counter()
        model(tokens)
        fwd = time.perf_counter() - t1
    flops_fwd = args.n_prompts * attribution_forward_flops_per_prompt(
        cfg, args.seq, len(saes), args.d_sae
    )
    cpu_flops = flops_fwd / fwd
    a100 = 0.4 * perf.NOMINAL_PEAK_FLOPS["A100"]["float32"]
    per_prompt = total / args.n_prompts
    est = per_prompt * args.target_prompts * cpu_flops / a100
    print(
        json.dumps(
            {
                "n_prompts": args.n_prompts,
                "seq": args.seq,
                "n_saes": len(saes),
                "d_sae": args.d_sae,
                "method": args.method,
                "seconds": scores.seconds,
                "seconds_per_prompt_cpu": per_prompt,
                "cpu_gflops": cpu_flops / 1e9,
                "a100_assumed_tflops": a100 / 1e12,
                "estimate_a100_seconds_for_target": est,
                "target_prompts": args.target_prompts,
                "n_nodes": len(scores.frame),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
