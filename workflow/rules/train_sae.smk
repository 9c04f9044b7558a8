# SAE training: the rules of the dictionary sources that train (sae.source capture: train_sae;
# stream: train_sae_stream), defined where one of the run's sources makes its dictionaries with
# them (its part of the run: PARTS).
# Exit 75 = checkpointed on SIGTERM: the retry (attempt 2, 3, ...) resumes from
# {OUT}/checkpoints and gets more walltime.
# Code: src/circuitflow/sae/ (stage.py for capture, stream_stage.py for stream).
from circuitflow import stream_groups as cf_stream_groups

if "train_sae" in PARTS:

    # One SAE per (site, layer) from its activation file (a transcoder: the layer's MLP input
    # and output files), one job each (on Slurm too: no job arrays, docs/design.md).
    rule train_sae:
        input:
            acts=dictionary_activations,
            model=f"{OUT}/model/model.json",
        output:
            directory(f"{OUT}/saes/{{site}}/layer_{{layer}}"),
        log:
            f"{OUT}/logs/train_sae/{{site}}_layer_{{layer}}.log",
        benchmark:
            f"{OUT}/benchmarks/train_sae/{{site}}_layer_{{layer}}.tsv"
        wildcard_constraints:
            site="|".join(cf_sites.dictionary_sites(PARTS["train_sae"])),
        retries: job_retries("train_sae")
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("train_sae")
        resources:
            **job_resources("train_sae", memory_by="site"),
        params:
            cfg=sae_job_config_json,
            # Outside the output: Snakemake deletes a directory() output before a retry.
            ckpt=lambda wc: f"{OUT}/checkpoints/saes/{wc.site}/layer_{wc.layer}",
        shell:
            stage(cf_sources.of_rule("train_sae").script)
            + " --config {params.cfg} --activations {input.acts} --model-json {input.model}"
            " --out {output} --checkpoint-dir {params.ckpt} > {log} 2>&1"


if TRANSCODERS:
    # The transcoders' own source (sae.transcoders.source apart from the SAEs').
    TRANSCODER_FILES = cf_sources.source_of(config, "mlp_out").reads_activation_files

    # Each transcoder's job measures it replacing its own MLP; this, all at once, on the same
    # held-out contexts (an activation file's last ones, or the token set's when streamed or
    # published).
    rule transcoder_replacement:
        input:
            saes=transcoder_outputs(),
            held_out=(
                [f"{OUT}/activations/mlp_in/layer_{LAYERS[0]}.h5"]
                if TRANSCODER_FILES
                else TOKEN_SET
            ),
            model=f"{OUT}/model/model.json",
        output:
            replacement_outputs(),
        log:
            f"{OUT}/logs/transcoder_replacement.log",
        benchmark:
            f"{OUT}/benchmarks/transcoder_replacement.tsv"
        conda:
            "../../envs/circuitflow.yaml"
        envmodules:
            *job_envmodules(),
        threads: job_threads("transcoder_replacement")
        resources:
            **job_resources("transcoder_replacement"),
        params:
            cfg=config_json("seed", "device", "model", "capture", "sae"),
            held_out="--activations" if TRANSCODER_FILES else "--tokens",
        shell:
            stage("transcoder_replacement")
            + " --config {params.cfg} --transcoders {input.saes} {params.held_out}"
            " {input.held_out} --model-json {input.model} --out {output} > {log} 2>&1"


if "train_sae_stream" in PARTS:
    # The SAE jobs run the model themselves over the token set, one job per group of sites
    # and layers (sae.stream.layers_per_job; auto: planned for the profile's GPU type), each
    # SAE still written to its own saes/{site}/layer_{layer}/. One rule per group, all with
    # the rule table's resources of train_sae_stream (memory and walltime of that group).
    STREAM_PART = PARTS["train_sae_stream"]
    try:
        SAE_GROUPS = cf_stream_groups.stream_groups(STREAM_PART, CLUSTER)
    except cf_config.ConfigError as err:
        raise WorkflowError(f"config error: {err}") from None

    for group in SAE_GROUPS:

        rule:
            name:
                f"train_sae_stream_{group.name}"
            input:
                model=f"{OUT}/model/model.json",
                npy=TOKEN_SET[0],
                json=TOKEN_SET[1],
            output:
                [
                    directory(f"{OUT}/saes/{site}/layer_{layer}")
                    for site, layer in group.members
                ],
            log:
                f"{OUT}/logs/train_sae_stream/{group.name}.log",
            benchmark:
                f"{OUT}/benchmarks/train_sae_stream/{group.name}.tsv"
            retries: job_retries("train_sae_stream", group.key)
            conda:
                "../../envs/circuitflow.yaml"
            envmodules:
                *job_envmodules(),
            threads: job_threads("train_sae_stream")
            resources:
                **job_resources("train_sae_stream", group.key),
            params:
                cfg=stream_config_json(STREAM_PART),
                members=" ".join(f"{site}:{layer}" for site, layer in group.members),
                # Outside the outputs: Snakemake deletes directory() outputs before a retry.
                ckpt=f"{OUT}/checkpoints/saes/stream/{group.name}",
            shell:
                stage(cf_sources.of_rule("train_sae_stream").script)
                + " --config {params.cfg} --model-json {input.model} --tokens-npy {input.npy}"
                " --tokens-json {input.json} --members {params.members} --out {output}"
                " --checkpoint-dir {params.ckpt} > {log} 2>&1"
