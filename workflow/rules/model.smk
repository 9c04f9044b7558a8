# The model stage: train the embedded default, or pre-fetch a real model's weights.
# Code: src/circuitflow/model/ (embedded.py trains, load.py loads and pre-fetches).

if cf_config.is_embedded(config):

    rule train_model:
        output:
            json=f"{OUT}/model/model.json",
            loss=report(
                f"{OUT}/model/training_loss.png",
                caption="../report/training_loss.rst",
                category="Model",
                labels={"figure": "training loss"},
            ),
        log:
            f"{OUT}/logs/train_model.log",
        benchmark:
            f"{OUT}/benchmarks/train_model.tsv"
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("train_model")
        resources:
            **job_resources("train_model"),
        params:
            cfg=config_json("seed", "device", "embedded"),
        shell:
            stage("train_model") + " --config {params.cfg} --out {output.json} 2> {log}"

else:

    localrules:
        prefetch_model,

    # Runs on the login node, which has internet; compute nodes load from the cache offline.
    # A local directory is only read and hashed; a TransformerLens checkpoint's files are its
    # inputs, so editing one reruns every stage after it.
    rule prefetch_model:
        input:
            cf_checkpoint.inputs_of(config["model"]["name"]),
        output:
            f"{OUT}/model/model.json",
        log:
            f"{OUT}/logs/prefetch_model.log",
        benchmark:
            f"{OUT}/benchmarks/prefetch_model.tsv"
        params:
            cfg=config_json("model"),
        shell:
            stage("prefetch_model", online=True)
            + " --config {params.cfg} --out {output} 2> {log}"
