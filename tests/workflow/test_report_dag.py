"""The report a researcher attaches to a paper: the default run, then `snakemake --report`,
looked at in headless Chromium. Every figure and table is opened through the report's own menu; the
page must load without JavaScript errors and show each one (an <img> or <iframe> of that file).
Screenshots are left in the test's temporary directory."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers.chromium import browse, chromium
from helpers.dag import REPO, SNAKEMAKE
from helpers.graph_page import check_page

from circuitflow.features.write import read_labels

pytestmark = pytest.mark.slow

# (category[/subcategory], row labels of the result, file shown)
SHOWN = [
    ("Model", ["training loss"], "training_loss.png"),
    (
        "Baseline/Figures",
        ["induction", "logit difference and calibration"],
        "induction_calibration.png",
    ),
    ("Baseline/Summary", ["all", "metrics table"], "baseline.html"),
    ("SAEs", ["metrics per layer"], "sae_metrics.png"),
    ("SAEs", ["L0 controller history"], "sae_controller.png"),
    ("SAEs", ["metrics table"], "sae_metrics.html"),
    ("Attribution", ["induction", "head effects"], "heads.png"),
    ("Attribution", ["induction", "top SAE features"], "features.png"),
    ("Attribution", ["induction", "circuit graph"], "graph.html"),
    ("Interventions", ["induction", "faithfulness and completeness"], "faithfulness.png"),
    ("Interventions", ["induction", "single-head ablation"], "heads.png"),
    ("Interventions", ["induction", "head pairs and triplets"], "head_sets.png"),
    ("Interventions", ["induction", "feature steering"], "steering.png"),
    ("Interventions", ["all", "head effects across behaviours"], "heads_across_behaviours.png"),
    ("Tables", ["induction", "attribution and ablation tables"], "tables.html"),
    ("Job costs", ["wall time and memory"], "job_costs.png"),
    ("Job costs", ["table"], "job_costs.html"),
    ("Job costs", ["GPU-hours of a full run"], "gpu_hours.html"),
    ("Provenance", ["reproducibility checklist"], "provenance.html"),
    ("Features", ["all", "feature browser"], "features.html"),
    ("Features", ["resid_post layer 1", "feature browser"], "layer_1.html"),
]

# Collects JavaScript errors from the start; after load, clicks through `steps` (a category
# name, `row:a|b` for the eye button of the result whose cells read a and b, `back` for the
# breadcrumb) and records which report files an <img>/<iframe> showed after each step.
HEAD_JS = (
    "<script>window.__errors=[];window.__shown=[];"
    "window.addEventListener('error',e=>window.__errors.push(String(e.message)));</script>"
)
STEPS_JS = (REPO / "tests" / "helpers" / "report_steps.js").read_text()


def with_steps(report: Path, steps: list[str], out: Path) -> Path:
    html = report.read_text()
    html = html.replace("<head>", "<head>" + HEAD_JS, 1)
    end = html.rindex("</body>")
    script = "<script>" + STEPS_JS.replace("STEPS", json.dumps(steps)) + "</script>"
    out.write_text(html[:end] + script + html[end:])
    return out


@pytest.fixture(scope="module")
def report_html(default_results, tmp_path_factory) -> Path:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config_file = tmp_path_factory.mktemp("report") / "config.yaml"
    config_file.write_text(yaml.safe_dump(config | {"outdir": str(default_results)}))
    report = config_file.parent / "report.html"
    done = subprocess.run(
        [*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(REPO),
         "--configfile", str(config_file), "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return report


def test_report_pages_and_provenance_files(report_html, default_results):
    results = default_results
    for name in ("hashes.json", "slurm_jobs.json", "pip_freeze.txt", "run.json",
                 "environment.json", "config.resolved.yaml"):  # fmt: skip
        assert (results / "provenance" / name).stat().st_size > 0, name
    hashes = json.loads((results / "provenance" / "hashes.json").read_text())
    assert hashes["files"]["model_weights"] and hashes["files"]["activations"]
    assert hashes["files"]["prompt_sets"] and hashes["files"]["token_sets"]
    slurm = json.loads((results / "provenance" / "slurm_jobs.json").read_text())
    assert slurm["jobs"] == [] and slurm["reason"]  # a local run
    assert json.loads((results / "provenance" / "run.json").read_text())["seeds"]["seed"] == 0
    # The behaviour's pages state the flags on its numbers and the graph's own faithfulness
    # and completeness as a circuit.
    summary = json.loads((results / "interventions" / "induction" / "summary.json").read_text())
    tables = html.unescape((results / "report" / "induction" / "tables.html").read_text())
    graph_page = html.unescape((results / "report" / "induction" / "graph.html").read_text())
    assert summary["flags"], "the default run's induction summary raises flags"
    for flag in summary["flags"]:
        assert flag["text"] in tables and flag["text"] in graph_page
    assert "the graph as a circuit (" in graph_page
    costs = (results / "report" / "job_costs.csv").read_text()
    for rule in ("train_model", "capture", "train_sae", "attribution", "interventions"):
        assert f"\n{rule}," in costs, rule
    assert report_html.stat().st_size > 100_000
    # The default trains transcoders (sae.kind both): each behaviour's per-prompt graphs page
    # is in the report under Attribution, with its caption.
    text = report_html.read_text()
    assert "per-prompt graphs" in text and "prompt_graphs.html" in text
    assert "Per-prompt attribution graphs of behaviour" in text


def _cells(row: str, tag: str) -> list[str]:
    return [html.unescape(c) for c in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", row, re.S)]


def table_after(page: str, heading: str) -> pd.DataFrame:
    """The first table after the heading `heading` of a report page, as text."""
    part = page[page.index(heading) :]
    rows = re.findall(r"<tr>(.*?)</tr>", part[: part.index("</table>")], re.S)
    return pd.DataFrame([_cells(r, "td") for r in rows[1:]], columns=_cells(rows[0], "th"))


def test_feature_browser_of_every_dictionary_and_labels_in_the_tables(default_results, tmp_path):
    """report/features.html lists every dictionary the run has and links its page, which opens
    a feature's card at its address; the behaviour's features table labels each feature as the
    features stage does."""
    folders = sorted((default_results / "features").glob("*/layer_*"))
    labels = read_labels(folders)
    assert {site for site, _ in labels} == {"resid_post", "mlp_out"}  # SAEs and transcoders
    site, layer = next(iter(labels))
    feature = next(iter(labels[(site, layer)]))
    anchor = f"{site}.{layer}.f{feature}"
    checks = (REPO / "tests" / "helpers" / "features_page_checks.js").read_text()
    index = default_results / "report" / "features.html"
    rows = re.findall(r'<tr id="([^"]+)" data-dictionary="[^"]+"><td><a href="([^"]+)">',
                      index.read_text())  # fmt: skip
    assert sorted(key for key, _ in rows) == sorted(f"{s}.{n}" for s, n in labels)
    pages = {key: index.parent / href for key, href in rows}
    assert all(p.is_file() for p in pages.values())
    found = check_page(chromium(), pages[f"{site}.{layer}"], tmp_path, checks, fragment=anchor)
    assert found["errors"] == []
    assert found["opened"]["anchor"] == anchor
    assert found["opened"]["label"] == labels[(site, layer)][feature]
    tables = (default_results / "report" / "induction" / "tables.html").read_text()
    table = table_after(tables, "SAE features by attribution")
    assert len(table) > 0 and "label" in table.columns
    for r in table.itertuples():
        expected = (
            "error term" if r.feature == "-1" else labels[(r.site, int(r.layer))][int(r.feature)]
        )
        assert r.label == expected and expected


def test_sae_table_has_the_features_pass_fractions(default_results):
    """sae_metrics.csv's features_dead_fraction and features_dense_fraction are the features
    stage's, counted here from each dictionary's features.parquet (densities over one pass of
    the same tokens, whatever the source)."""
    import pandas as pd

    table = pd.read_csv(default_results / "report" / "sae_metrics.csv")
    assert len(table) == 4  # both layers' SAEs and transcoders
    for row in table.itertuples():
        stats = pd.read_parquet(
            default_results / "features" / row.site / f"layer_{row.layer}" / "features.parquet"
        )
        threshold = json.loads(
            (
                default_results / "features" / row.site / f"layer_{row.layer}" / "summary.json"
            ).read_text()
        )["dense_threshold"]
        assert row.features_dead_fraction == pytest.approx((stats["count"] == 0).mean())
        assert row.features_dense_fraction == pytest.approx((stats["density"] > threshold).mean())


def test_report_in_chromium(report_html, tmp_path):
    browser = chromium()
    steps = []
    for category, labels, _ in SHOWN:
        steps += [*category.split("/"), "row:" + "|".join(labels), "back"]
    page = with_steps(report_html, steps, tmp_path / "report_steps.html")
    done = browse(browser, page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert "circuitflow run on model" in dom
    errors = json.loads(re.search(r'data-errors="([^"]*)"', dom).group(1).replace("&quot;", '"'))
    assert errors == [], errors
    shown = json.loads(re.search(r'data-shown="([^"]*)"', dom).group(1).replace("&quot;", '"'))
    assert len(shown) == len(SHOWN)
    for (category, labels, filename), (_step, files) in zip(SHOWN, shown, strict=True):
        assert filename in files, f"{category} {labels}: showed {files}, not {filename}"

    # Screenshots of the front page and a figure, for a person to look at; not blank.
    import matplotlib.image

    for name, steps in {
        "front": [],
        "faithfulness": ["Interventions", "row:induction|faithfulness and completeness"],
    }.items():
        shot = tmp_path / f"{name}.png"
        done = browse(browser, with_steps(report_html, steps, tmp_path / f"{name}.html"),
                      f"--screenshot={shot}")  # fmt: skip
        assert shot.is_file(), done.stderr[-2000:]
        pixels = matplotlib.image.imread(shot)
        assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05, name
    print(f"screenshots in {tmp_path}")
