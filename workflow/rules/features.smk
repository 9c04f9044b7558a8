# Feature interpretation: per dictionary (SAEs and transcoders, trained or published) density,
# histograms, top and quantile-sampled contexts, promoted tokens and a label, from one streamed
# pass of the model per group of layers (features.layers_per_job). Exit 75 = checkpointed on
# SIGTERM: the retry resumes from {OUT}/checkpoints/features. Code: src/circuitflow/features/.
FEATURE_GROUPS = cf_features_plan.groups(config)


for group in FEATURE_GROUPS:

    rule:
        name:
            f"features_{group.name}"
        input:
            model=f"{OUT}/model/model.json",
            npy=TOKEN_SET[0],
            json=TOKEN_SET[1],
            saes=[f"{OUT}/saes/{site}/layer_{layer}" for site, layer in group.members],
        output:
            [
                directory(f"{OUT}/features/{site}/layer_{layer}")
                for site, layer in group.members
            ],
        log:
            f"{OUT}/logs/features/{group.name}.log",
        benchmark:
            f"{OUT}/benchmarks/features/{group.name}.tsv"
        retries: job_retries("features", group.key)
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("features")
        resources:
            **job_resources("features", group.key),
        params:
            # embedded: the model's shape, which the job's memory plan reads from the config.
            cfg=config_json(
                "seed", "device", "model", "embedded", "capture", "sae", "features"
            ),
            # Outside the outputs: Snakemake deletes directory() outputs before a retry.
            ckpt=f"{OUT}/checkpoints/features/{group.name}",
        shell:
            stage("features")
            + " --config {params.cfg} --model-json {input.model} --tokens-npy {input.npy}"
            " --tokens-json {input.json} --saes {input.saes} --out {output}"
            " --checkpoint-dir {params.ckpt} > {log} 2>&1"
