#!/usr/bin/env python
"""Fetch the explainer language model that features.labeller names into the Hugging Face cache
(rule prefetch_explainer, a localrule: the login node, which has internet; a local directory is
checked and described) and write its record for the explain_features jobs, which run offline.

Exit status: 0 done; 2 bad config (features.labeller names no model, or an unusable one)."""

from circuitflow import cli


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config")
    cli.add_outputs(parser, "json", json="explainer.json to write")
    args, config = cli.parse(parser)
    from circuitflow.errors import ConfigError
    from circuitflow.features.config import explainer_named
    from circuitflow.io import write_json
    from circuitflow.model.load import prefetch

    name = explainer_named(config)
    if name is None:
        raise ConfigError(f"features.labeller: {config['features']['labeller']!r} names no model")
    info = prefetch(name, config["model"]["hf_cache"])
    write_json(args.out_json, info)
    print(f"explainer: {name} ({info['kind']}), {info['architecture']['n_params']:,} parameters")


if __name__ == "__main__":
    cli.main(run)
