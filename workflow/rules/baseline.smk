# The unmodified model on each behaviour: logit difference, accuracy, calibration.
# Code: src/circuitflow/baseline.py.


rule baseline:
    input:
        model=f"{OUT}/model/model.json",
        prompts=f"{OUT}/prompts/{{behaviour}}.parquet",
    output:
        json=f"{OUT}/baseline/{{behaviour}}.json",
        table=f"{OUT}/baseline/{{behaviour}}.parquet",
        figure=report(
            f"{OUT}/baseline/{{behaviour}}_calibration.png",
            caption="../report/baseline.rst",
            category="Baseline",
            subcategory="Figures",
            labels={
                "behaviour": "{behaviour}",
                "figure": "logit difference and calibration",
            },
        ),
    log:
        f"{OUT}/logs/baseline/{{behaviour}}.log",
    benchmark:
        f"{OUT}/benchmarks/baseline/{{behaviour}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("baseline")
    resources:
        **job_resources("baseline"),
    params:
        cfg=config_json("device", "model", "baseline"),
    shell:
        stage("baseline") + " --config {params.cfg} --behaviour {wildcards.behaviour}"
        " --prompts {input.prompts} --model-json {input.model} --out-json {output.json}"
        " --out-parquet {output.table} --out-figure {output.figure} 2> {log}"
