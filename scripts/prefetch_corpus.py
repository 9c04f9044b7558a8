#!/usr/bin/env python
"""Download the capture corpus (a Hugging Face dataset) into the cache (needs internet: run on a
login node), so the capture jobs can read it offline."""

from circuitflow import cli
from circuitflow.capture import tokens
from circuitflow.capture.config import CaptureConfig
from circuitflow.io import write_json


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config")
    parser.add_argument("--out", required=True, help="prefetch.json to write")
    args, config = cli.parse(parser)
    cap = CaptureConfig.from_dict(config["capture"])
    info = tokens.prefetch(cap.corpus, cap.split, config["model"]["hf_cache"])
    write_json(args.out, info)
    print(f"{info['dataset']} ({info['split']}): {info['n_rows']} rows, ready offline")


if __name__ == "__main__":
    cli.main(run)
