#!/usr/bin/env python
"""Fetch the published dictionaries of SAELens releases (sae.pretrained release and sae_id; with
sae.kind both also sae.transcoders') into the Hugging Face cache (needs internet: run on a login
node), check each against the model and list them in prefetch.json, so the pretrained_sae jobs
load them offline."""

from circuitflow import cli
from circuitflow.sae.pretrained_stage import prefetch_stage


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "model-json")
    parser.add_argument("--out", required=True, help="prefetch.json to write")
    args, config = cli.parse(parser)
    summary = prefetch_stage(config, args.model_json, args.out)
    print(
        f"{', '.join(summary['releases'])}: {len(summary['dictionaries'])} dictionaries ready "
        "offline in "
        f"{summary['hub_cache']}"
    )


if __name__ == "__main__":
    cli.main(run)
