#!/usr/bin/env python
"""Download the capture corpus (a Hugging Face dataset) into the cache (needs internet: run on a
login node), so the capture jobs can read it offline."""

import argparse

from circuitflow import config as cf_config
from circuitflow.capture import tokens
from circuitflow.cli import main
from circuitflow.io import write_json


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--out", required=True, help="prefetch.json to write")
    args = parser.parse_args()
    config = cf_config.load(args.config)
    cap = config["capture"]
    info = tokens.prefetch(cap["corpus"], cap["split"], config["model"].get("hf_cache"))
    write_json(args.out, info)
    print(f"{info['dataset']} ({info['split']}): {info['n_rows']} rows, ready offline")


if __name__ == "__main__":
    main(run)
