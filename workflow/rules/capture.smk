# Activation capture: the token set is built once; one job (or one per shard) runs the model
# once per batch and writes every site and layer. Killed jobs resume from
# activations/.../layer_N.h5.partial (not a declared output, so --rerun-incomplete keeps it);
# exit 75 = checkpointed on SIGTERM, the retry resumes. Code: src/circuitflow/capture/
# (tokens.py builds the token set, stage.py captures, files.py is the HDF5 format).
CAPTURE = config["capture"]
SHARDS = CAPTURE["shards"]
ACTS = f"{OUT}/activations"


CAPTURE_CMD = (
    stage("capture")
    + " run --config {params.cfg} --model-json {input.model} --tokens-npy {input.npy}"
    " --tokens-json {input.json} --out-dir {params.out_dir} --shard {params.shard}"
    f" --n-shards {SHARDS} 2> {{log}}"
)


if CAPTURE["corpus"] and not Path(CAPTURE["corpus"]).exists():

    localrules:
        prefetch_corpus,

    # Runs on the login node, which has internet; the tokens job reads the cache offline.
    rule prefetch_corpus:
        output:
            f"{OUT}/corpus/prefetch.json",
        log:
            f"{OUT}/logs/prefetch_corpus.log",
        benchmark:
            f"{OUT}/benchmarks/prefetch_corpus.tsv"
        params:
            cfg=config_json("model", "capture"),
        shell:
            stage("prefetch_corpus", online=True)
            + " --config {params.cfg} --out {output} 2> {log}"


rule capture_tokens:
    input:
        model=f"{OUT}/model/model.json",
        corpus=(
            [f"{OUT}/corpus/prefetch.json"]
            if CAPTURE["corpus"] and not Path(CAPTURE["corpus"]).exists()
            else [CAPTURE["corpus"]] if CAPTURE["corpus"] else []
        ),
    output:
        npy=f"{ACTS}/tokens.npy",
        json=f"{ACTS}/tokens.json",
    log:
        f"{OUT}/logs/capture_tokens.log",
    benchmark:
        f"{OUT}/benchmarks/capture_tokens.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("capture_tokens")
    resources:
        **job_resources("capture_tokens"),
    params:
        cfg=tokens_config_json(),
    shell:
        stage("capture") + " tokens --config {params.cfg} --model-json {input.model}"
        " --out-npy {output.npy} --out-json {output.json} 2> {log}"


# Only a dictionary source that reads activation files (sae.source capture) has them written, for
# its own dictionaries: stream and pretrained capture nothing.
if READS_ACTIVATION_FILES and SHARDS == 1:

    rule capture:
        input:
            model=f"{OUT}/model/model.json",
            npy=f"{ACTS}/tokens.npy",
            json=f"{ACTS}/tokens.json",
        output:
            capture_outputs(),
        log:
            f"{OUT}/logs/capture.log",
        benchmark:
            f"{OUT}/benchmarks/capture.tsv"
        retries: job_retries("capture")
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("capture")
        resources:
            **job_resources("capture"),
        params:
            cfg=capture_config_json(),
            out_dir=lambda wc, output: Path(output[0]).parent.parent,
            shard=0,
        shell:
            CAPTURE_CMD

elif READS_ACTIVATION_FILES:

    rule capture_shard:
        input:
            model=f"{OUT}/model/model.json",
            npy=f"{ACTS}/tokens.npy",
            json=f"{ACTS}/tokens.json",
        output:
            temp(
                expand(
                    f"{ACTS}/shards/{{{{shard}}}}/{{site}}/layer_{{layer}}.h5",
                    site=CAPTURE_SITES,
                    layer=LAYERS,
                )
            ),
        log:
            f"{OUT}/logs/capture/shard_{{shard}}.log",
        benchmark:
            f"{OUT}/benchmarks/capture/shard_{{shard}}.tsv"
        retries: job_retries("capture_shard")
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("capture_shard")
        resources:
            **job_resources("capture_shard"),
        params:
            cfg=capture_config_json(),
            out_dir=lambda wc, output: Path(output[0]).parent.parent,
            shard=lambda wc: wc.shard,
        shell:
            CAPTURE_CMD

    rule merge_capture:
        input:
            expand(
                f"{ACTS}/shards/{{shard}}/{{{{site}}}}/layer_{{{{layer}}}}.h5",
                shard=range(SHARDS),
            ),
        output:
            f"{ACTS}/{{site}}/layer_{{layer}}.h5",
        log:
            f"{OUT}/logs/merge_capture/{{site}}_layer_{{layer}}.log",
        benchmark:
            f"{OUT}/benchmarks/merge_capture/{{site}}_layer_{{layer}}.tsv"
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("merge_capture")
        resources:
            **job_resources("merge_capture"),
        shell:
            stage("capture", light=True) + " merge --out {output} {input} 2> {log}"
