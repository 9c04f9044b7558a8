#!/usr/bin/env python
"""Fetch a real model's weights into the Hugging Face cache (needs internet: run on a login
node) and write model.json describing it, so stage jobs can load it offline."""

from circuitflow import cli
from circuitflow.model.load import prefetch_stage


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config")
    parser.add_argument("--out", required=True, help="model.json to write")
    args, config = cli.parse(parser)
    info = prefetch_stage(config, args.out)
    arch = info["architecture"]
    print(f"{info['name']}: {arch['n_layers']} layers, d_model {arch['d_model']}, ready offline")


if __name__ == "__main__":
    cli.main(run)
