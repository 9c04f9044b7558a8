#!/usr/bin/env python
"""Write one behaviour's prompt set (clean/corrupted tokens, answer, distractor) as parquet."""

from pathlib import Path

from circuitflow import cli, prompts


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "behaviour", "model-json")
    parser.add_argument("--out", required=True, help="output parquet file")
    args, config = cli.parse(parser)
    frame = prompts.run(config, args.behaviour, Path(args.model_json).parent, args.out)
    print(f"{args.behaviour}: {len(frame)} prompts -> {args.out}")


if __name__ == "__main__":
    cli.main(run)
