# Report pages: summary tables and figures of every stage, the cost of every job and the
# provenance checklist, for `snakemake --report`. Run after the stages; job_costs runs last.
# Code: src/circuitflow/report/ (stage.py writes every page).


rule sae_summary:
    input:
        saes=sae_outputs(),
        # Each dictionary's dead and dense fractions from the features stage's one pass.
        features=features_outputs(),
    output:
        csv=f"{REPORT}/sae_metrics.csv",
        html=report(
            f"{REPORT}/sae_metrics.html",
            caption="../report/sae_metrics_table.rst",
            category="SAEs",
            labels={"layer": "all", "figure": "metrics table"},
        ),
        figure=report(
            f"{REPORT}/sae_metrics.png",
            caption="../report/sae_metrics.rst",
            category="SAEs",
            labels={"layer": "all", "figure": "metrics per layer"},
        ),
        controller=report(
            f"{REPORT}/sae_controller.png",
            caption="../report/sae_controller.rst",
            category="SAEs",
            labels={"layer": "all", "figure": "L0 controller history"},
        ),
    log:
        f"{OUT}/logs/report/sae_summary.log",
    benchmark:
        f"{OUT}/benchmarks/sae_summary.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("sae_summary")
    resources:
        **job_resources("sae_summary"),
    shell:
        stage("report", light=True)
        + " sae --saes {input.saes} --features-dirs {input.features}"
        " --out-csv {output.csv}"
        " --out-html {output.html} --out-figure {output.figure}"
        " --out-controller {output.controller} 2> {log}"


rule report_baseline:
    input:
        baseline_outputs(),
    output:
        csv=f"{REPORT}/baseline.csv",
        html=report(
            f"{REPORT}/baseline.html",
            caption="../report/baseline_table.rst",
            category="Baseline",
            # Its own subcategory: beside one calibration figure, two results with two `figure`
            # values would make the report's toggle heuristic hide (and crash on) one of them.
            subcategory="Summary",
            labels={"behaviour": "all", "figure": "metrics table"},
        ),
    log:
        f"{OUT}/logs/report/baseline.log",
    benchmark:
        f"{OUT}/benchmarks/report_baseline.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("report_baseline")
    resources:
        **job_resources("report_baseline"),
    shell:
        stage("report", light=True) + " baseline --json {input} --out-csv {output.csv}"
        " --out-html {output.html} 2> {log}"


# Also the attribution graph's page again, with the steering results the interventions stage
# wrote after attribution: the copy the report shows.
rule report_behaviour:
    input:
        attribution=f"{ATTR}/{{behaviour}}/graph.json",
        contexts=f"{ATTR}/{{behaviour}}/feature_contexts.parquet",
        interventions=f"{IV}/{{behaviour}}/summary.json",
        steering=f"{IV}/{{behaviour}}/steering.parquet",
        # With transcoders beside the SAEs (sae.kind both), the page leads with these.
        prompt_graphs=behaviour_prompt_graphs,
        # Each SAE feature's label (the features table); the graph page links the browser.
        features=features_outputs(SAE_SITES),
    output:
        tables=report(
            f"{REPORT}/{{behaviour}}/tables.html",
            caption="../report/behaviour_tables.rst",
            category="Tables",
            labels={
                "behaviour": "{behaviour}",
                "figure": "attribution and ablation tables",
            },
        ),
        graph=report(
            f"{REPORT}/{{behaviour}}/graph.html",
            caption="../report/attribution_graph.rst",
            category="Attribution",
            labels={"behaviour": "{behaviour}", "figure": "circuit graph"},
        ),
    log:
        f"{OUT}/logs/report/{{behaviour}}.log",
    benchmark:
        f"{OUT}/benchmarks/report_behaviour/{{behaviour}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("report_behaviour")
    resources:
        **job_resources("report_behaviour"),
    params:
        attr_dir=lambda wc: f"{ATTR}/{wc.behaviour}",
        iv_dir=lambda wc: f"{IV}/{wc.behaviour}",
        prompt_graphs=lambda wc, input: (
            f"--prompt-graphs {input.prompt_graphs}" if input.prompt_graphs else ""
        ),
        features_html=feature_browser_option,
    shell:
        stage("report", light=True) + " behaviour --behaviour {wildcards.behaviour}"
        " --attribution-dir {params.attr_dir} --interventions-dir {params.iv_dir}"
        " {params.prompt_graphs} --features-dirs {input.features} {params.features_html}"
        " --out-html {output.tables} --out-graph {output.graph} 2> {log}"


rule report_provenance:
    input:
        provenance_outputs(),
        provenance_run_outputs(),
    output:
        report(
            f"{REPORT}/provenance.html",
            caption="../report/provenance.rst",
            category="Provenance",
            labels={"figure": "reproducibility checklist"},
        ),
    log:
        f"{OUT}/logs/report/provenance.log",
    benchmark:
        f"{OUT}/benchmarks/report_provenance.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("report_provenance")
    resources:
        **job_resources("report_provenance"),
    params:
        prov_dir=lambda wc, input: Path(input[0]).parent,
    shell:
        stage("report", light=True) + " provenance --provenance-dir {params.prov_dir}"
        " --out-html {output} 2> {log}"


# GPU-hours of a full run from the GPU benchmark suite's results committed under
# benchmarks/results/ (benchmarks/gpu_suite.py), for this run and the CSD3 reference config.
SUITE_RESULTS = cf_gpu_hours.suite_files(
    Path(workflow.basedir) / "benchmarks" / "results"
)


rule report_gpu_hours:
    input:
        suite=SUITE_RESULTS,
        reference=Path(workflow.basedir) / "config" / "qwen2.5-0.5b.yaml",
    output:
        csv=f"{REPORT}/gpu_hours.csv",
        html=report(
            f"{REPORT}/gpu_hours.html",
            caption="../report/gpu_hours.rst",
            category="Job costs",
            labels={"figure": "GPU-hours of a full run"},
        ),
    log:
        f"{OUT}/logs/report/gpu_hours.log",
    benchmark:
        f"{OUT}/benchmarks/report_gpu_hours.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("report_gpu_hours")
    resources:
        **job_resources("report_gpu_hours"),
    params:
        cfg=config_json(
            "model",
            "layers",
            "sites",
            "behaviours",
            "capture",
            "sae",
            "attribution",
            "interventions",
        ),
        gpu=CLUSTER.gpu_type,
        max_runtime=CLUSTER.max_runtime or 0,
    shell:
        stage("report", light=True)
        + " gpu_hours --suite {input.suite} --config {params.cfg}"
        " --reference-config {input.reference} --gpu {params.gpu}"
        " --max-runtime {params.max_runtime}"
        " --out-csv {output.csv} --out-html {output.html} 2> {log}"


# The feature browser: a page per dictionary (features.smk's folder), each its own job whose
# memory grows with that dictionary's features (features/browser_plan.py) ...
rule report_features_dictionary:
    input:
        f"{OUT}/features/{{site}}/layer_{{layer}}",
    output:
        # cf_nodes.dictionary_page: the graph pages link each feature's card here.
        report(
            f"{REPORT}/features/{{site}}/layer_{{layer}}.html",
            caption="../report/features_dictionary.rst",
            category="Features",
            labels={"dictionary": "{site} layer {layer}", "figure": "feature browser"},
        ),
    log:
        f"{OUT}/logs/report/features/{{site}}_layer_{{layer}}.log",
    benchmark:
        f"{OUT}/benchmarks/report_features_dictionary/{{site}}_layer_{{layer}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("report_features_dictionary")
    resources:
        **job_resources("report_features_dictionary", memory_by=("site", "layer")),
    shell:
        stage("report", light=True)
        + " features --features-dir {input} --out-html {output} 2> {log}"


# ... and the index of them all (FEATURE_BROWSER), where a reader starts.
rule report_features:
    input:
        pages=feature_page_outputs(),
        features=features_outputs(),
    output:
        report(
            FEATURE_BROWSER,
            caption="../report/features_browser.rst",
            category="Features",
            labels={"dictionary": "all", "figure": "feature browser"},
        ),
    log:
        f"{OUT}/logs/report/features.log",
    benchmark:
        f"{OUT}/benchmarks/report_features.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("report_features")
    resources:
        **job_resources("report_features"),
    shell:
        stage("report", light=True)
        + " features_index --features-dirs {input.features} --out-html {output} 2> {log}"


# Last: every other job's benchmark file exists once its outputs do.
rule job_costs:
    input:
        stages=stage_outputs(),
        report=[
            f"{REPORT}/sae_metrics.csv",
            f"{REPORT}/baseline.csv",
            f"{REPORT}/provenance.html",
            f"{REPORT}/gpu_hours.html",
            *feature_browser_outputs(),
            *(
                []
                if not SAE_SITES
                else expand(
                    f"{REPORT}/{{behaviour}}/tables.html", behaviour=BEHAVIOURS
                )
            ),
        ],
        environment=f"{OUT}/provenance/environment.json",
    output:
        csv=f"{REPORT}/job_costs.csv",
        html=report(
            f"{REPORT}/job_costs.html",
            caption="../report/job_costs_table.rst",
            category="Job costs",
            labels={"figure": "table"},
        ),
        figure=report(
            f"{REPORT}/job_costs.png",
            caption="../report/job_costs.rst",
            category="Job costs",
            labels={"figure": "wall time and memory"},
        ),
    log:
        f"{OUT}/logs/report/job_costs.log",
    benchmark:
        f"{OUT}/benchmarks/job_costs.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("job_costs")
    resources:
        **job_resources("job_costs"),
    params:
        cfg=config_json("device", "model", "embedded", "sites", "behaviours"),
    shell:
        stage("report", light=True)
        + " job_costs --config {params.cfg} --outdir "
        + OUT
        + " --environment {input.environment} --out-csv {output.csv}"
        " --out-html {output.html} --out-figure {output.figure} 2> {log}"


# `snakemake check`: requirements and a smoke test on the device the stages would use (not part
# of `all`; always runs). Same resources as baseline, so on Slurm it lands on a GPU node.
rule check:
    log:
        f"{OUT}/logs/check.log",
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: 1
    resources:
        **job_resources("baseline"),
    params:
        # The sections the disk plan reads (resources.disk_plan, through the run's
        # description) besides device and dtype.
        cfg=config_json(
            "outdir",
            "device",
            "model",
            "embedded",
            "layers",
            "sites",
            "behaviours",
            "capture",
            "sae",
        ),
        json=f"{OUT}/logs/check_env.json",
    shell:
        stage("check_env", light=True)
        + " --config {params.cfg} --json {params.json} 2>&1 | tee {log}"
