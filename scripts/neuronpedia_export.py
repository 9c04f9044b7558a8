#!/usr/bin/env python
"""Write a run's feature files (the features rules' features/{site}/layer_N/) as the feature
batches SAEDashboard 0.8.0's Neuronpedia runner writes, one runner folder per dictionary
(circuitflow.features.neuronpedia documents the format), for Neuronpedia's upload tools.

    python scripts/neuronpedia_export.py --results results --out results/neuronpedia

Exit status: 0 done; 2 no feature files or unreadable ones."""

from pathlib import Path

from circuitflow import cli


def model_id(results: Path) -> str:
    """Neuronpedia's id of the run's model: the model's official name (gpt2-small is
    TransformerLens's `gpt2`: pass --model-id), `circuitflow-embedded` for the embedded one."""
    from circuitflow.model.load import read_model_json

    info = read_model_json(results / "model")
    return info.get("official_name") or f"circuitflow-{info['kind']}"


def run() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--results", required=True, type=Path, help="the run's outdir")
    parser.add_argument(
        "--out", type=Path, help="where the folders go (default: RESULTS/neuronpedia)"
    )
    parser.add_argument(
        "--model-id", help="the model's id on Neuronpedia (default: from model.json)"
    )
    parser.add_argument(
        "--sae-set", help="the SAE set's name, {site} allowed (default: circuitflow-{site})"
    )
    parser.add_argument("--features-per-batch", type=cli.positive_int, default=128,
                        help="features a batch file holds (at least 1; default 128)")  # fmt: skip
    args, _ = cli.parse(parser)
    from circuitflow.features.neuronpedia import SAE_SET, export_run

    folders = export_run(
        args.results,
        args.out or args.results / "neuronpedia",
        args.model_id or model_id(args.results),
        args.sae_set or SAE_SET,
        args.features_per_batch,
    )
    for folder in folders:
        print(f"neuronpedia: {folder} ({len(list(folder.glob('batch-*.json')))} batches)")


if __name__ == "__main__":
    cli.main(run)
