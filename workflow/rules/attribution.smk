# Attribution per behaviour: node effects (heads, MLPs, SAE features and error terms) on the
# logit difference, validated against exact patching, and a pruned graph with edges.
# Code: src/circuitflow/attribution/ (stage.py writes the outputs).


rule attribution:
    input:
        model=f"{OUT}/model/model.json",
        prompts=f"{OUT}/prompts/{{behaviour}}.parquet",
        baseline=f"{OUT}/baseline/{{behaviour}}.json",
        saes=spliced_sae_outputs(),
        # Paired with the SAEs by the hook name each file records (their sae.source capture):
        # they say whether the SAEs' rows leave BOS out.
        acts=capture_outputs(SAE_SITES),
        features=features_outputs(SAE_SITES),  # each feature's label and top contexts
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
    priority: CRITICAL_PATH
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("attribution")
    resources:
        **job_resources("attribution"),
    params:
        # Without activation files the capture section says whether the SAEs' rows leave BOS
        # out (capture.exclude_bos); with them each file says so.
        cfg=(
            config_json("device", "model", "attribution")
            if SOURCE.reads_activation_files
            else config_json("device", "model", "attribution", "capture")
        ),
        out_dir=lambda wc: f"{ATTR}/{wc.behaviour}",
    shell:
        stage("attribution")
        + " --config {params.cfg} --behaviour {wildcards.behaviour}"
        " --prompts {input.prompts} --model-json {input.model} --saes {input.saes}"
        " --activations {input.acts} --features {input.features}"
        " --out-dir {params.out_dir} 2> {log}"


# Transcoders (sae.kind transcoder or both): per prompt, the exact attribution graph of the local replacement model
# (circuit-tracer's), pruned by influence, as circuit-tracer graph files.
# Code: src/circuitflow/attribution/prompt_graphs/.
rule prompt_graphs:
    input:
        model=f"{OUT}/model/model.json",
        prompts=f"{OUT}/prompts/{{behaviour}}.parquet",
        transcoders=transcoder_outputs(),
        # Each feature's label (clerp) and top-activating contexts.
        features=features_outputs(["mlp_out"]),
    output:
        graphs=directory(f"{ATTR}/{{behaviour}}/prompt_graphs"),
        page=report(
            f"{ATTR}/{{behaviour}}/prompt_graphs.html",
            caption="../report/prompt_graphs.rst",
            category="Attribution",
            labels={"behaviour": "{behaviour}", "figure": "per-prompt graphs"},
        ),
    log:
        f"{OUT}/logs/prompt_graphs/{{behaviour}}.log",
    benchmark:
        f"{OUT}/benchmarks/prompt_graphs/{{behaviour}}.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("prompt_graphs")
    resources:
        **job_resources("prompt_graphs"),
    params:
        cfg=config_json("device", "model", "attribution", "capture"),
        # The feature browser the page links each feature to (the report writes it).
        features_html=feature_browser_option,
    shell:
        stage("prompt_graphs")
        + " --config {params.cfg} --behaviour {wildcards.behaviour} --prompts {input.prompts}"
        " --model-json {input.model} --transcoders {input.transcoders}"
        " --features {input.features} {params.features_html} --out-dir {output.graphs}"
        " --page {output.page} 2> {log}"
