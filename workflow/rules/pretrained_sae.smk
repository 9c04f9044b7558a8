# Published dictionaries (sae.source: pretrained): fetched once on the login node, then each
# site and layer's dictionary evaluated on the run's tokens and written in SAELens's format.
# Code: src/circuitflow/sae/pretrained.py (sources, checks), pretrained_stage.py (the stages).

if SAE_SOURCE == "pretrained":
    PRETRAINED = config["sae"]["pretrained"]
    PRETRAINED_PREFETCH = f"{OUT}/pretrained/prefetch.json"
    # What the jobs read (editing sae.lr and the like reruns nothing): the device, the model,
    # where the dictionaries come from, the evaluation's contexts, and whether BOS is left out
    # of it (capture.exclude_bos, as for the token set); the prefetch also every site and layer.
    PRETRAINED_CONFIG = {
        "device": config["device"],
        "model": config["model"],
        "sae": {
            "source": SAE_SOURCE,
            "pretrained": PRETRAINED,
            "eval_contexts": config["sae"]["eval_contexts"],
        },
        "capture": {"exclude_bos": config["capture"]["exclude_bos"]},
    }
    PRETRAINED_PREFETCH_CONFIG = PRETRAINED_CONFIG | {"layers": LAYERS, "sites": SITES}
    # Each job's input: a local dictionary's files (an edit reruns its job), or the prefetch's
    # record, for its order only: adding a layer fetches it without rerunning the others.
    PRETRAINED_INPUT = {
        (site, str(layer)): (
            [ancient(PRETRAINED_PREFETCH)]
            if PRETRAINED["path"] is None
            else [
                Path(PRETRAINED["path"].format(site=site, layer=layer)) / name
                for name in ("cfg.json", "sae_weights.safetensors")
            ]
        )
        for site in SITES
        for layer in LAYERS
    }

    if PRETRAINED["release"] is not None:

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
                cfg=json_param(PRETRAINED_PREFETCH_CONFIG),
            shell:
                stage("prefetch_saes", online=True)
                + " --config {params.cfg} --model-json {input.model} --out {output} 2> {log}"

    rule pretrained_sae:
        input:
            source=lambda wc: PRETRAINED_INPUT[(wc.site, wc.layer)],
            model=f"{OUT}/model/model.json",
            npy=TOKEN_SET[0],
            json=TOKEN_SET[1],
        output:
            directory(f"{OUT}/saes/{{site}}/layer_{{layer}}"),
        log:
            f"{OUT}/logs/pretrained_sae/{{site}}_layer_{{layer}}.log",
        benchmark:
            f"{OUT}/benchmarks/pretrained_sae/{{site}}_layer_{{layer}}.tsv"
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("pretrained_sae")
        resources:
            **job_resources("pretrained_sae"),
        params:
            cfg=json_param(PRETRAINED_CONFIG),
        shell:
            stage("pretrained_sae")
            + " --config {params.cfg} --site {wildcards.site} --layer {wildcards.layer}"
            " --model-json {input.model} --tokens-npy {input.npy} --tokens-json {input.json}"
            " --out {output} > {log} 2>&1"
