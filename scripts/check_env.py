#!/usr/bin/env python
"""Requirements check and smoke test: Python, key packages, torch and CUDA, GPUs (memory, bf16,
TF32), free disk under the results directory, the config's device and dtype against the hardware,
and a tiny forward pass and SAE step on that device. Exits 1 listing what is missing."""

import sys
from pathlib import Path

from circuitflow import check_env, cli
from circuitflow.io import write_json

REPO = Path(__file__).resolve().parents[1]


def run() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument(
        "--config",
        default=str(REPO / "config" / "config.yaml"),
        help="config JSON (as a rule passes it) or YAML file (default: config/config.yaml)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override `device`")
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="override model.dtype"
    )
    parser.add_argument(
        "--outdir", help="results directory whose disk is checked (default: outdir)"
    )
    parser.add_argument(
        "--min-free-gb", type=float, default=check_env.DEFAULT_MIN_FREE_GB, help="free disk needed"
    )
    parser.add_argument("--json", help="also write the checks to this JSON file")
    args, config = cli.parse(parser)
    if args.device:
        config["device"] = args.device
    if args.dtype:
        config["model"]["dtype"] = args.dtype
    checks = check_env.run_checks(config, args.outdir, args.min_free_gb)
    print(check_env.format_checks(checks))
    bad = check_env.failures(checks)
    if args.json:
        write_json(args.json, {"ok": not bad, "checks": checks})
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    cli.main(run)
