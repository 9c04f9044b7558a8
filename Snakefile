# circuitflow: baseline -> activation capture -> per-layer SAEs -> attribution -> interventions
# -> report, for the embedded default model or a real one. See README.md.


# A config given with --configfile replaces the embedded default instead of being merged into it
# (a merge would keep the default's behaviours next to yours); unset keys take the schema's defaults.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/baseline.smk"
include: "workflow/rules/provenance.smk"
include: "workflow/rules/train_sae.smk"
include: "workflow/rules/pretrained_sae.smk"
include: "workflow/rules/capture.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/attribution.smk"
include: "workflow/rules/interventions.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        baseline_outputs(),
        provenance_outputs(),
        capture_outputs(),
        sae_outputs(),
        replacement_outputs(),
        features_outputs(),
        attribution_outputs(),
        interventions_outputs(),
        report_outputs(),


# Before any job, dry runs included (the rules above declared every job): a plan that cannot
# fit a node of the profile or this machine (memory, walltime) is refused in one line naming
# the key that drives it; one that does not fit the free disk under outdir, warned of.
if workflow.is_main_process:
    check_fit()
