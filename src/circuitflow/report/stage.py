"""The report rules (sae_summary, report_baseline, report_behaviour, report_provenance,
report_gpu_hours, job_costs): each writes its HTML page for `snakemake --report`, with a CSV
beside every table and the figures; report_behaviour also the attribution graph's page with the
interventions' steering results, the graph's own faithfulness and completeness as a circuit and
the flags on the interventions' numbers. Each page's sections and figures are in `pages/`
(`sae`, `baseline`, `behaviour`, `provenance`, `gpu_hours`), built with the HTML kit `html.py`
from other stages' files read through `inputs.py`; the job costs' tables are in `job_costs.py`.
The feature browser (report_features_dictionary's pages, report_features's index) is
`features_page.py`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from circuitflow.attribution.page import browser_href, graph_html
from circuitflow.interventions.flags import flags
from circuitflow.io import save_figure, write_text
from circuitflow.report import inputs
from circuitflow.report import job_costs as costs
from circuitflow.report.html import page, table_html
from circuitflow.report.pages import baseline as baseline_page
from circuitflow.report.pages import behaviour as behaviour_page
from circuitflow.report.pages import provenance as provenance_page
from circuitflow.report.pages import sae as sae_page

# What the job costs page shows of provenance/environment.json.
ENVIRONMENT_KEYS = ("cuda_available", "gpus", "hostname")


def write_csv(path: Path | str, frame: pd.DataFrame) -> None:
    write_text(path, frame.to_csv(index=False))


def sae_summary(
    sae_dirs, out_csv, out_html, out_figure, out_controller, feature_dirs=()
) -> pd.DataFrame:
    metrics = sae_page.read_sae_metrics(sae_dirs)
    fractions = sae_page.read_feature_fractions(feature_dirs) if feature_dirs else None
    table = sae_page.sae_table(metrics, fractions)
    write_csv(out_csv, table)
    intro = (
        "One row per trained SAE (saes/{site}/layer_{layer}/metrics.json). l0: mean active "
        "latents per token; explained_variance of the activations; ce_loss_recovered: (CE "
        "zero-ablated - CE with the SAE) / (CE zero-ablated - clean CE); dead_fraction: latents "
        "that never fired over the last dead_window_tokens (a published dictionary: over its "
        "evaluation contexts); features_dead_fraction and features_dense_fraction: latents "
        "that never fired, and that fired on more than features.dense_threshold of the tokens, "
        "in the features stage's pass (the same tokens for every dictionary, whatever its "
        "source)."
    )
    write_text(out_html, page("SAE metrics per layer", [("SAEs", table_html(table))], intro))
    save_figure(out_figure, sae_page.plot_sae_metrics(table))
    save_figure(out_controller, sae_page.plot_controller(metrics))
    return table


def baseline(baseline_jsons, out_csv, out_html) -> pd.DataFrame:
    table = baseline_page.baseline_table(baseline_jsons)
    write_csv(out_csv, table)
    intro = "Baseline of every behaviour on the unmodified model (baseline/{behaviour}.json)."
    write_text(out_html, page("Baseline metrics", [("Baseline", table_html(table))], intro))
    return table


def behaviour(
    name: str, attribution_dir, interventions_dir, out_html, top: int = 15, prompt_graphs=None,
    feature_dirs=(),
) -> None:  # fmt: skip
    """tables.html of a behaviour (pages/behaviour.py); `prompt_graphs`: its per-prompt graphs'
    directory, where transcoders drew them, which the page leads with; `feature_dirs`: the
    features stage's folders of its SAEs, whose labels the features table shows."""
    sections = behaviour_page.behaviour_sections(
        attribution_dir, interventions_dir, top, prompt_graphs, feature_dirs
    )
    write_text(out_html, page(f"Results of behaviour {name}", sections))


def graph_page(name: str, attribution_dir, interventions_dir, out_html, features_html=None) -> None:
    """The attribution stage's graph page again, now that the interventions stage has run: each
    steered feature's card adds the tokens it promotes (interventions/steering.parquet), and
    the header the graph's own faithfulness and completeness as a circuit with the flags on the
    interventions' numbers (interventions/summary.json). This is the copy the report shows.
    `features_html`: the feature browser's index (report/features.html), beside whose
    dictionary pages a click on a feature opens its card; None: no links."""
    attr, iv = Path(attribution_dir), Path(interventions_dir)
    graph = inputs.json_of(attr / "graph.json", ("nodes", "edges"), "attribution", "graph")
    contexts = inputs.table_of(attr / "feature_contexts.parquet", (), "attribution", "contexts")
    steering = inputs.table_of(iv / "steering.parquet", (), "interventions", "steering table")
    summary = behaviour_page.read_summary(iv)
    href = browser_href(out_html, features_html)
    html = graph_html(graph, f"{name} circuit", contexts, steering, summary, flags(summary), href)
    write_text(out_html, html)


def provenance(provenance_dir, out_html) -> None:
    sections = provenance_page.provenance_sections(provenance_dir)
    intro = "Everything needed to reproduce this run; the JSON files are in provenance/."
    write_text(out_html, page("Provenance", sections, intro))


def gpu_hours(
    suite_paths,
    run_config: dict,
    reference_config: Path | str,
    out_csv,
    out_html,
    gpu: str = "A100",
    max_runtime: int | None = None,
) -> None:
    """GPU-hours of this run and of the CSD3 reference run on a `gpu` (the cluster's
    `gpu_type`, its walltime cap `max_runtime` grouping the streaming jobs as the dry run
    does), from every GPU suite result."""
    from circuitflow import config as cf_config
    from circuitflow.cluster import Cluster
    from circuitflow.report import gpu_hours as gh
    from circuitflow.report.pages.gpu_hours import gpu_hours_sections

    cluster = Cluster(gpu_type=gpu, max_runtime=max_runtime)

    reference = cf_config.load(reference_config)
    name = f"the CSD3 reference run ({Path(reference_config).name})"
    sections = gpu_hours_sections(suite_paths, run_config, reference, name, gpu, cluster)
    frames = []
    for path in suite_paths:
        try:
            frame = gh.estimate(gh.load_suite(path), reference, gpu=gpu, cluster=cluster)
        except ValueError:
            continue
        frames.append(frame.assign(suite=Path(path).name, config=Path(reference_config).name))
    write_csv(out_csv, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    intro = (
        f"{gpu}-hours of a full run, stage by stage, from the rates benchmarks/gpu_suite.py "
        f"measured (benchmarks/results/*.json). A result from a GPU other than an {gpu}, or from "
        "a CPU, is projected by its roofline share and says so; baseline and interventions, not "
        "in the suite, are charged at its rate for a bare forward pass. The GPU is the "
        "profile's gpu_type."
    )
    write_text(out_html, page("GPU-hours of a full run", sections, intro))


def job_costs(config: dict, outdir, environment, out_csv, out_html, out_figure) -> pd.DataFrame:
    """Wall time, peak memory, CPU time and GPU-hours per rule and per job, from Snakemake's
    benchmark files (benchmarks/**.tsv)."""
    env = inputs.json_of(environment, ENVIRONMENT_KEYS, "provenance", "environment")
    gpu_seen = bool(env.get("cuda_available")) and config["device"] != "cpu"
    frame = costs.job_costs(outdir, config, list(config["behaviours"]), gpu_seen)
    write_csv(out_csv, frame)
    gpus = env.get("gpus") or []
    where = f"{len(gpus)} x {gpus[0]['name']}" if gpus else "no GPU (CPU only)"
    intro = (
        f"From Snakemake's benchmark files (benchmarks/**.tsv) on {env.get('hostname')}, "
        f"{where}. wall_s: wall time; max_rss_mb: peak resident memory of the job's processes; "
        "gpu_hours: wall time x GPUs of jobs that ran on a GPU; gpu_peak_memory_mb: peak GPU "
        "memory the SAE trainer recorded; forward_equivalents_per_prompt: forward passes of "
        "the model the job counted where they ran (a backward counts two, a pass through some "
        "of the layers that share), per forward_equivalents_unit (a prompt; a context for "
        "capture; an evaluation context for train_sae, whose training steps are not model "
        "passes). The report's own jobs are not included."
    )
    sections = [
        ("Per rule", table_html(costs.per_rule(frame))),
        ("Per job (rule, behaviour, site and layer)", table_html(frame)),
    ]
    write_text(out_html, page("Cost of every job", sections, intro))
    save_figure(out_figure, costs.plot(frame))
    return frame
