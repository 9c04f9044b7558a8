# The unmodified model on each behaviour: logit difference, accuracy, calibration.


rule baseline:
    input:
        model=f"{OUT}/model/model.json",
        prompts=f"{OUT}/prompts/{{behaviour}}.parquet",
    output:
        json=f"{OUT}/baseline/{{behaviour}}.json",
        table=f"{OUT}/baseline/{{behaviour}}.parquet",
        figure=f"{OUT}/baseline/{{behaviour}}_calibration.png",
    log:
        f"{OUT}/logs/baseline/{{behaviour}}.log",
    benchmark:
        f"{OUT}/benchmarks/baseline/{{behaviour}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    resources:
        mem_mb=model_mem_mb,
        runtime=30,
    params:
        cfg=config_json("device", "model", "baseline"),
    shell:
        stage("baseline") + " --config {params.cfg} --behaviour {wildcards.behaviour}"
        " --prompts {input.prompts} --model-json {input.model} --out-json {output.json}"
        " --out-parquet {output.table} --out-figure {output.figure} 2> {log}"
