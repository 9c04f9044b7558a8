# One SAE per (site, layer); on Slurm each job is one array task. Exit 75 = checkpointed on
# SIGTERM: the retry (attempt 2, 3, ...) resumes from {OUT}/checkpoints and gets more walltime.


rule train_sae:
    input:
        acts=f"{OUT}/activations/{{site}}/layer_{{layer}}.h5",
        model=f"{OUT}/model/model.json",
    output:
        directory(f"{OUT}/saes/{{site}}/layer_{{layer}}"),
    log:
        f"{OUT}/logs/train_sae/{{site}}_layer_{{layer}}.log",
    benchmark:
        f"{OUT}/benchmarks/train_sae/{{site}}_layer_{{layer}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("train_sae")
    resources:
        **job_resources("train_sae"),
    params:
        cfg=config_json("seed", "device", "sae"),
        dtype=config["model"]["dtype"],
        # Outside the output: Snakemake deletes a directory() output before a retry.
        ckpt=lambda wc: f"{OUT}/checkpoints/saes/{wc.site}/layer_{wc.layer}",
    shell:
        stage("train_sae")
        + " --activations {input.acts} --model-dir $(dirname {input.model})"
        " --out {output} --checkpoint-dir {params.ckpt} --threads {threads}"
        " --model-dtype {params.dtype} --config-json {params.cfg} > {log} 2>&1"
