#!/usr/bin/env python
"""Train one SAE on one layer's activations (stage ``train_sae``).

Exit codes: 0 done; 2 bad arguments or config; 3 unusable input (incomplete activation file,
corrupt checkpoint); 75 stopped by SIGTERM after checkpointing (rerun to resume); 1 other error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

EXIT_CONFIG = 2
EXIT_INPUT = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--activations", required=True, type=Path, help="activations/{site}/layer_N.h5")
    p.add_argument("--model-dir", required=True, type=Path, help="results model/ directory")
    p.add_argument("--out", required=True, type=Path, help="output dir saes/{site}/layer_N")
    p.add_argument(
        "--config-json",
        default="{}",
        help="JSON (string or file): the sae: config block, or {seed, device, sae} as rules pass",
    )
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="where checkpoints live (default: OUT.ckpt next to OUT)",
    )
    p.add_argument("--device", default=None, help="override sae.device (auto, cpu, cuda, cuda:1)")
    p.add_argument("--model-dtype", default="float32", help="dtype the model is loaded in")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p.parse_args(argv)


def _load_config_json(value: str) -> dict:
    text = Path(value).read_text() if not value.lstrip().startswith("{") else value
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError("--config-json must be a JSON object")
    return obj


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    import torch

    from circuitflow.sae_checkpoint import CheckpointError
    from circuitflow.sae_data import ActivationFileError, read_activation_info
    from circuitflow.sae_training import (
        EXIT_INTERRUPTED,
        SAETrainConfig,
        TrainingInterrupted,
        resolve_device,
        train_sae,
    )

    try:
        raw = _load_config_json(args.config_json)
        if "sae" in raw:  # the pipeline's sections: the master seed and device serve every stage
            raw = {**raw["sae"], "device": raw.get("device", "auto"), "seed": raw.get("seed", 0)}
        if args.device:
            raw["device"] = args.device
        cfg = SAETrainConfig.from_dict(raw)
    except (OSError, ValueError, TypeError) as exc:
        print(f"train_sae: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        # Imported here so the library stays testable without the model stage's module.
        from circuitflow.models import load_model

        # Reject an unusable activation file before paying for the model load.
        read_activation_info(args.activations)
        model = load_model(
            args.model_dir, device=resolve_device(cfg.device), dtype=args.model_dtype
        )
        metrics = train_sae(args.activations, args.out, cfg, model, args.checkpoint_dir)
    except (ActivationFileError, CheckpointError) as exc:
        print(f"train_sae: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except TrainingInterrupted as exc:
        print(f"train_sae: {exc}; rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(
        f"train_sae: {args.out}: l0={metrics['l0']:.2f} "
        f"explained_variance={metrics['explained_variance']:.3f} "
        f"ce_loss_recovered={metrics['ce_loss_recovered']} "
        f"dead_fraction={metrics['dead_fraction']:.3f} tokens_per_s={metrics['tokens_per_s']:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
