# Interventions per behaviour: circuits of the top nodes by score against the run's ablation
# (faithfulness, completeness, random controls; the ablation and patching views, pruned), head ablations (single, pairs, triplets), feature ablation and steering;
# then one table of head effects across behaviours. Code: src/circuitflow/interventions/.


rule interventions:
    input:
        model=f"{OUT}/model/model.json",
        prompts=f"{OUT}/prompts/{{behaviour}}.parquet",
        heads=f"{ATTR}/{{behaviour}}/heads.parquet",
        components=f"{ATTR}/{{behaviour}}/components.parquet",
        features=f"{ATTR}/{{behaviour}}/features.parquet",
        graph=f"{ATTR}/{{behaviour}}/graph.json",
        saes=spliced_sae_outputs(),
    output:
        circuits=f"{IV}/{{behaviour}}/circuits.parquet",
        component_circuits=f"{IV}/{{behaviour}}/component_circuits.parquet",
        ablation_scores=f"{IV}/{{behaviour}}/ablation_scores.parquet",
        circuit_views=f"{IV}/{{behaviour}}/circuit_views.parquet",
        heads=f"{IV}/{{behaviour}}/heads.parquet",
        head_sets=f"{IV}/{{behaviour}}/head_sets.parquet",
        features=f"{IV}/{{behaviour}}/features.parquet",
        steering=f"{IV}/{{behaviour}}/steering.parquet",
        summary=f"{IV}/{{behaviour}}/summary.json",
        curves=report(
            f"{IV}/{{behaviour}}/faithfulness.png",
            caption="../report/interventions_faithfulness.rst",
            category="Interventions",
            labels={
                "behaviour": "{behaviour}",
                "figure": "faithfulness and completeness",
            },
        ),
        heatmap=report(
            f"{IV}/{{behaviour}}/heads.png",
            caption="../report/interventions_heads.rst",
            category="Interventions",
            labels={"behaviour": "{behaviour}", "figure": "single-head ablation"},
        ),
        sets_plot=report(
            f"{IV}/{{behaviour}}/head_sets.png",
            caption="../report/interventions_head_sets.rst",
            category="Interventions",
            labels={"behaviour": "{behaviour}", "figure": "head pairs and triplets"},
        ),
        steering_plot=report(
            f"{IV}/{{behaviour}}/steering.png",
            caption="../report/interventions_steering.rst",
            category="Interventions",
            labels={"behaviour": "{behaviour}", "figure": "feature steering"},
        ),
    log:
        f"{OUT}/logs/interventions/{{behaviour}}.log",
    benchmark:
        f"{OUT}/benchmarks/interventions/{{behaviour}}.tsv"
    priority: CRITICAL_PATH
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("interventions")
    resources:
        **job_resources("interventions"),
    params:
        cfg=config_json("device", "model", "seed", "interventions"),
        attr_dir=lambda wc: f"{ATTR}/{wc.behaviour}",
        out_dir=lambda wc: f"{IV}/{wc.behaviour}",
    shell:
        stage("interventions")
        + " behaviour --config {params.cfg} --behaviour {wildcards.behaviour}"
        " --prompts {input.prompts} --model-json {input.model} --attribution-dir {params.attr_dir}"
        " --saes {input.saes} --out-dir {params.out_dir} 2> {log}"


rule interventions_across:
    input:
        heads=expand(f"{IV}/{{behaviour}}/heads.parquet", behaviour=BEHAVIOURS),
    output:
        table=f"{IV}/heads_across_behaviours.parquet",
        figure=report(
            f"{IV}/heads_across_behaviours.png",
            caption="../report/interventions_across.rst",
            category="Interventions",
            labels={"behaviour": "all", "figure": "head effects across behaviours"},
        ),
    log:
        f"{OUT}/logs/interventions/across.log",
    benchmark:
        f"{OUT}/benchmarks/interventions/across.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("interventions_across")
    resources:
        **job_resources("interventions_across"),
    params:
        behaviours=BEHAVIOURS,
    shell:
        stage("interventions", light=True)
        + " across --behaviours {params.behaviours} --heads {input.heads}"
        " --out {output.table} --out-figure {output.figure} 2> {log}"
