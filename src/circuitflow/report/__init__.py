"""The report (rules in report.smk): `stage` writes each page, `pages/` holds each page's sections
and figures, `html` the HTML kit they are built with, `inputs` the one checked reader of other
stages' files, `job_costs` reads Snakemake's benchmark files, `gpu_hours` projects a full run's
cost from the GPU suite's results."""
