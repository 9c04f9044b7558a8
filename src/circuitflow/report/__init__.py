"""The report (rules in report.smk): `stage` writes each page, `tables` builds the tables and
figures, `job_costs` reads Snakemake's benchmark files, `gpu_hours` projects a full run's cost
from the GPU suite's results."""
