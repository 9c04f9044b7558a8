# Feature interpretation: per dictionary (SAEs and transcoders, trained or published) density,
# histograms, top and quantile-sampled contexts, promoted tokens and a label, from one streamed
# pass of the model per group of layers (features.layers_per_job). Exit 75 = checkpointed on
# SIGTERM: the retry resumes from {OUT}/checkpoints/features. Code: src/circuitflow/features/.
FEATURE_GROUPS = cf_features_plan.groups(config)
# features.labeller naming a language model: the features jobs write to features_deterministic/
# and an explain_features job per group writes features/ from there (features/explainer.py).
EXPLAINER = cf_features_config.explainer_named(config)
PASS_OUT = f"{OUT}/features_deterministic" if EXPLAINER else f"{OUT}/features"
# The contexts every label is scored on: held out from every dictionary and every label, after
# the token set (features/held_out.py).
HELD_OUT = [
    f"{OUT}/activations/held_out_tokens.npy",
    f"{OUT}/activations/held_out_tokens.json",
]


rule held_out_tokens:
    input:
        model=f"{OUT}/model/model.json",
        json=TOKEN_SET[1],
        corpus=rules.capture_tokens.input.corpus,  # a text corpus is packed again
    output:
        npy=HELD_OUT[0],
        json=HELD_OUT[1],
    log:
        f"{OUT}/logs/held_out_tokens.log",
    benchmark:
        f"{OUT}/benchmarks/held_out_tokens.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("held_out_tokens")
    resources:
        **job_resources("held_out_tokens"),
    params:
        # Only the held-out size of the features section: another features key reruns nothing.
        cfg=json_param(
            cf_config.section(config, "seed", "model", "capture")
            | {"features": {"held_out_tokens": config["features"]["held_out_tokens"]}}
        ),
    shell:
        stage("held_out_tokens")
        + " --config {params.cfg} --model-json {input.model} --tokens-json {input.json}"
        " --out-npy {output.npy} --out-json {output.json} 2> {log}"


for group in FEATURE_GROUPS:

    rule:
        name:
            f"features_{group.name}"
        input:
            model=f"{OUT}/model/model.json",
            npy=TOKEN_SET[0],
            json=TOKEN_SET[1],
            held_npy=HELD_OUT[0],
            held_json=HELD_OUT[1],
            saes=[f"{OUT}/saes/{site}/layer_{layer}" for site, layer in group.members],
        output:
            [
                directory(f"{PASS_OUT}/{site}/layer_{layer}")
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
            " --tokens-json {input.json} --held-out-npy {input.held_npy}"
            " --held-out-json {input.held_json} --saes {input.saes} --out {output}"
            " --checkpoint-dir {params.ckpt} > {log} 2>&1"


if EXPLAINER:

    localrules:
        prefetch_explainer,

    # Runs on the login node, which has internet; the explain jobs load it offline.
    rule prefetch_explainer:
        output:
            f"{OUT}/explainer/explainer.json",
        log:
            f"{OUT}/logs/prefetch_explainer.log",
        benchmark:
            f"{OUT}/benchmarks/prefetch_explainer.tsv"
        params:
            cfg=config_json("model", "features"),
        shell:
            stage("prefetch_explainer", online=True)
            + " --config {params.cfg} --out-json {output} 2> {log}"

    for group in FEATURE_GROUPS:

        rule:
            name:
                f"explain_features_{group.name}"
            input:
                explainer=f"{OUT}/explainer/explainer.json",
                features=[
                    f"{PASS_OUT}/{site}/layer_{layer}" for site, layer in group.members
                ],
            output:
                [
                    directory(f"{OUT}/features/{site}/layer_{layer}")
                    for site, layer in group.members
                ],
            log:
                f"{OUT}/logs/explain_features/{group.name}.log",
            benchmark:
                f"{OUT}/benchmarks/explain_features/{group.name}.tsv"
            retries: job_retries("explain_features", group.key)
            conda:
                "../../envs/circuitflow.yaml"
            envmodules:
                *job_envmodules(),
            threads: job_threads("explain_features")
            resources:
                **job_resources("explain_features", group.key),
            params:
                cfg=config_json("seed", "device", "model", "features"),
                ckpt=f"{OUT}/checkpoints/explain_features/{group.name}",
            shell:
                stage("explain_features")
                + " --config {params.cfg} --explainer-json {input.explainer}"
                " --features {input.features} --out {output}"
                " --checkpoint-dir {params.ckpt} > {log} 2>&1"
