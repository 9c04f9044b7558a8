# Software, hardware, job and code versions, and the config as resolved.
# Code: src/circuitflow/provenance.py.


rule provenance:
    output:
        environment=f"{OUT}/provenance/environment.json",
        config=f"{OUT}/provenance/config.resolved.yaml",
    log:
        f"{OUT}/logs/provenance.log",
    benchmark:
        f"{OUT}/benchmarks/provenance.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("provenance")
    resources:
        **job_resources("provenance"),
    params:
        # model.same_as included: its check is recorded in environment.json.
        cfg=json_param(cf_config.section(config, *config, same_as=True)),
    shell:
        stage("provenance", light=True)
        + " environment --config {params.cfg} --out-environment {output.environment}"
        " --out-config {output.config} 2> {log}"


# After the stages: sha256 of model weights, prompt sets, token sets, activation files and SAE
# weights; this run's Slurm jobs from sacct (an empty list and the reason off Slurm); pip freeze;
# seeds and failed jobs (Snakemake's logs, sacct).
rule provenance_run:
    input:
        stage_outputs(),
    output:
        hashes=f"{OUT}/provenance/hashes.json",
        slurm=f"{OUT}/provenance/slurm_jobs.json",
        freeze=f"{OUT}/provenance/pip_freeze.txt",
        run=f"{OUT}/provenance/run.json",
    log:
        f"{OUT}/logs/provenance_run.log",
    benchmark:
        f"{OUT}/benchmarks/provenance_run.tsv"
    conda:
        "../../envs/circuitflow.yaml"
    envmodules:
        *job_envmodules(),
    threads: job_threads("provenance_run")
    resources:
        **job_resources("provenance_run"),
    params:
        cfg=config_json(*config),
    shell:
        stage("provenance", light=True)
        + " after-run --config {params.cfg} --outdir "
        + OUT
        + " --out-hashes {output.hashes}"
        " --out-slurm {output.slurm} --out-pip-freeze {output.freeze} --out-run {output.run}"
        " 2> {log}"
