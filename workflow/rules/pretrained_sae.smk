# Published dictionaries (sae.source: pretrained, or with sae.kind both the transcoders'
# sae.transcoders.source): fetched once on the login node, then each site and layer's
# dictionary evaluated on the run's tokens and written in SAELens's format, one job per group of
# sites and layers (grouped as the streaming jobs are).
# Code: src/circuitflow/sae/pretrained.py (sources, checks), pretrained_stage.py (the stages),
# src/circuitflow/stream_groups.py (the groups).
from circuitflow import published as cf_published
from circuitflow import stream_groups as cf_stream_groups

if "pretrained_sae" in PARTS:
    PRETRAINED_PART = PARTS["pretrained_sae"]
    PRETRAINED_PREFETCH = f"{OUT}/pretrained/prefetch.json"
    # What the jobs read (editing sae.lr and the like reruns nothing): the device, the model
    # (model.same_as included: the dictionaries are checked against it),
    # their sites and layers, where the dictionaries come from (sae.pretrained, and
    # sae.transcoders for the transcoders of sae.kind both), the evaluation's contexts, and
    # whether BOS is left out of it (capture.exclude_bos, as for the token set).
    PRETRAINED_CONFIG = {
        "device": config["device"],
        "model": cf_config.section(config, "model", same_as=True)["model"],
        "sites": PRETRAINED_PART["sites"],
        "layers": LAYERS,
        "sae": {
            key: PRETRAINED_PART["sae"][key]
            for key in ("source", "kind", "pretrained", "transcoders", "eval_contexts")
        },
        "capture": {"exclude_bos": config["capture"]["exclude_bos"]},
    }
    PRETRAINED_DICTIONARIES = {
        (d.site, str(d.layer)): d for d in cf_published.dictionaries(PRETRAINED_PART)
    }
    # Each job's input: a local dictionary's files (an edit reruns its job; a local copy of a
    # release: its file or folder), or the prefetch's record, for its order only: adding a
    # layer fetches it without rerunning the others.
    PRETRAINED_INPUT = {
        key: (
            [ancient(PRETRAINED_PREFETCH)]
            if d.path is None
            else (
                [Path(d.path) / d.sae_id]
                if d.converted
                else [
                    Path(d.path) / name
                    for name in ("cfg.json", "sae_weights.safetensors")
                ]
            )
        )
        for key, d in PRETRAINED_DICTIONARIES.items()
    }

    if any(d.path is None for d in PRETRAINED_DICTIONARIES.values()):

        localrules:
            prefetch_saes,

        # Runs on the login node, which has internet; the pretrained_sae jobs read the cache
        # offline (model.hf_cache, else $HF_HOME).
        rule prefetch_saes:
            input:
                model=f"{OUT}/model/model.json",
            output:
                PRETRAINED_PREFETCH,
            log:
                f"{OUT}/logs/prefetch_saes.log",
            benchmark:
                f"{OUT}/benchmarks/prefetch_saes.tsv"
            conda:
                "../../envs/circuitflow.yaml"
            params:
                cfg=json_param(PRETRAINED_CONFIG),
            shell:
                stage("prefetch_saes", online=True)
                + " --config {params.cfg} --model-json {input.model} --out {output} 2> {log}"

    # One job per group of sites and layers (sae.stream.layers_per_job; auto: as many as the
    # profile's walltime cap allows), the model loaded once for all of them, each dictionary
    # still written to its own saes/{site}/layer_{layer}/. One rule per group, all with the rule
    # table's resources of pretrained_sae (memory and walltime of that group).
    try:
        PRETRAINED_GROUPS = cf_stream_groups.stream_groups(PRETRAINED_PART, CLUSTER)
    except cf_config.ConfigError as err:
        raise WorkflowError(f"config error: {err}") from None
    for group in PRETRAINED_GROUPS:

        rule:
            name:
                f"pretrained_sae_{group.name}"
            input:
                source=list(
                    dict.fromkeys(
                        path
                        for site, layer in group.members
                        for path in PRETRAINED_INPUT[(site, str(layer))]
                    )
                ),
                model=f"{OUT}/model/model.json",
                npy=TOKEN_SET[0],
                json=TOKEN_SET[1],
            output:
                [
                    directory(f"{OUT}/saes/{site}/layer_{layer}")
                    for site, layer in group.members
                ],
            log:
                f"{OUT}/logs/pretrained_sae/{group.name}.log",
            benchmark:
                f"{OUT}/benchmarks/pretrained_sae/{group.name}.tsv"
            conda:
                "../../envs/circuitflow.yaml"
            envmodules:
                *job_envmodules(),
            threads: job_threads("pretrained_sae")
            resources:
                **job_resources("pretrained_sae", group.key),
            params:
                cfg=json_param(PRETRAINED_CONFIG),
                members=" ".join(f"{site}:{layer}" for site, layer in group.members),
            shell:
                stage(cf_sources.of_rule("pretrained_sae").script)
                + " --config {params.cfg} --members {params.members}"
                " --model-json {input.model} --tokens-npy {input.npy}"
                " --tokens-json {input.json} --out {output} > {log} 2>&1"
