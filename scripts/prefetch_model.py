#!/usr/bin/env python
"""Fetch a real model's weights into the Hugging Face cache (needs internet: run on a login
node) and write model.json describing it, so stage jobs can load it offline."""

import argparse

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.model.load import prefetch_stage


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="resolved config JSON or a config YAML")
    parser.add_argument("--out", required=True, help="model.json to write")
    args = parser.parse_args()
    info = prefetch_stage(cf_config.load(args.config), args.out)
    arch = info["architecture"]
    print(f"{info['name']}: {arch['n_layers']} layers, d_model {arch['d_model']}, ready offline")


if __name__ == "__main__":
    main(run)
