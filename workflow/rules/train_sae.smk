# One SAE per (site, layer), one job each (on Slurm too: no job arrays, docs/design.md). Exit 75 =
# checkpointed on SIGTERM: the retry (attempt 2, 3, ...) resumes from {OUT}/checkpoints and gets
# more walltime. Code: src/circuitflow/sae/ (stage.py writes the outputs).


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
        cfg=config_json("seed", "device", "model", "sae"),
        # Outside the output: Snakemake deletes a directory() output before a retry.
        ckpt=lambda wc: f"{OUT}/checkpoints/saes/{wc.site}/layer_{wc.layer}",
    shell:
        stage("train_sae")
        + " --config {params.cfg} --activations {input.acts} --model-json {input.model}"
        " --out {output} --checkpoint-dir {params.ckpt} > {log} 2>&1"
