# Software, hardware, job and code versions, and the config as resolved.


rule provenance:
    output:
        environment=f"{OUT}/provenance/environment.json",
        config=f"{OUT}/provenance/config.resolved.yaml",
    log:
        f"{OUT}/logs/provenance.log",
    conda:
        "../../envs/circuitflow.yaml"
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        cfg=config_json(*config),
    shell:
        stage("provenance")
        + " --config {params.cfg} --out-environment {output.environment}"
        " --out-config {output.config} 2> {log}"
