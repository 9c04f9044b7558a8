#!/usr/bin/env python
"""Fetch a real model's weights into the Hugging Face cache (needs internet: run on a login
node) and write model.json describing it, so stage jobs can load it offline."""

import argparse

from circuitflow import config as cf_config
from circuitflow.cli import main
from circuitflow.io import write_json
from circuitflow.models import prefetch


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--config", required=True, help="resolved config JSON or a config YAML file"
    )
    parser.add_argument("--out", required=True, help="model.json to write (weights go beside it)")
    args = parser.parse_args()
    model = cf_config.load(args.config)["model"]
    info = prefetch(model["name"], model.get("hf_cache")) | {"dtype": model["dtype"]}
    write_json(args.out, info)
    arch = info["architecture"]
    print(f"{info['name']}: {arch['n_layers']} layers, d_model {arch['d_model']}, ready offline")


if __name__ == "__main__":
    main(run)
