# Attribution per behaviour: node effects (heads, MLPs, SAE features and error terms) on the
# logit difference, validated against exact patching, and a pruned graph with edges.
# Code: src/circuitflow/attribution/ (stage.py writes the outputs).


rule attribution:
    input:
        model=f"{OUT}/model/model.json",
        prompts=f"{OUT}/prompts/{{behaviour}}.parquet",
        baseline=f"{OUT}/baseline/{{behaviour}}.json",
        saes=sae_outputs(),
        # Paired with the SAEs by the hook name each file records.
        acts=capture_outputs(),
    output:
        heads=f"{ATTR}/{{behaviour}}/heads.parquet",
        features=f"{ATTR}/{{behaviour}}/features.parquet",
        components=f"{ATTR}/{{behaviour}}/components.parquet",
        contexts=f"{ATTR}/{{behaviour}}/feature_contexts.parquet",
        summary=f"{ATTR}/{{behaviour}}/summary.json",
        graph=f"{ATTR}/{{behaviour}}/graph.json",
        heatmap=report(
            f"{ATTR}/{{behaviour}}/heads.png",
            caption="../report/attribution_heads.rst",
            category="Attribution",
            labels={"behaviour": "{behaviour}", "figure": "head effects"},
        ),
        feature_plot=report(
            f"{ATTR}/{{behaviour}}/features.png",
            caption="../report/attribution_features.rst",
            category="Attribution",
            labels={"behaviour": "{behaviour}", "figure": "top SAE features"},
        ),
        # The report shows report_behaviour's copy, which adds the steering results.
        html=f"{ATTR}/{{behaviour}}/graph.html",
    log:
        f"{OUT}/logs/attribution/{{behaviour}}.log",
    benchmark:
        f"{OUT}/benchmarks/attribution/{{behaviour}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("attribution")
    resources:
        **job_resources("attribution"),
    params:
        cfg=config_json("device", "model", "attribution"),
        out_dir=lambda wc: f"{ATTR}/{wc.behaviour}",
    shell:
        stage("attribution")
        + " --config {params.cfg} --behaviour {wildcards.behaviour}"
        " --prompts {input.prompts} --model-json {input.model} --saes {input.saes}"
        " --activations {input.acts} --out-dir {params.out_dir} 2> {log}"
