# One prompt set per behaviour: clean and corrupted tokens, answer and distractor ids.
# Code: src/circuitflow/prompts.py (SOURCES: one entry per behaviour source).


rule prompts:
    input:
        prompt_file,
        model=f"{OUT}/model/model.json",
    output:
        f"{OUT}/prompts/{{behaviour}}.parquet",
    log:
        f"{OUT}/logs/prompts/{{behaviour}}.log",
    benchmark:
        f"{OUT}/benchmarks/prompts/{{behaviour}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("prompts")
    resources:
        **job_resources("prompts"),
    params:
        cfg=config_json("seed", "behaviours"),
    shell:
        stage("prompts") + " --config {params.cfg} --behaviour {wildcards.behaviour}"
        " --model-json {input.model} --out {output} 2> {log}"
