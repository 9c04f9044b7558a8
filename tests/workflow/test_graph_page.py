"""The default run's attribution graph pages in headless Chromium, as a researcher opens them from
the report (report/{behaviour}/graph.html, with the steering results): no JavaScript errors, the
default thresholds show graph.json's graph, no edge passes through a node it does not connect,
a feature's card shows its contexts and the tokens it promotes, the thresholds re-prune; each
feature shows its label from graph.json and links its card in report/features.html, which opens
it.
Screenshots of each page, plain and with a feature's card open, are left in the test's temporary
directory."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest
from helpers.chromium import chromium
from helpers.graph_page import check_page, screenshot

from circuitflow.nodes import Node, dictionary_page

pytestmark = pytest.mark.slow
FEATURE_CHECKS_JS = (Path(__file__).parents[1] / "helpers" / "features_page_checks.js").read_text()


def pairs(edges) -> list[tuple[str, str]]:
    return sorted((e["source"], e["target"]) if isinstance(e, dict) else tuple(e) for e in edges)


@pytest.mark.parametrize("behaviour", ["induction", "facts"])
def test_default_run_graph_page(default_results, behaviour, tmp_path):
    browser = chromium()
    graph = json.loads((default_results / "attribution" / behaviour / "graph.json").read_text())
    steering = pd.read_parquet(default_results / "interventions" / behaviour / "steering.parquet")
    steered = steering[(steering["direction"] == "feature") & (steering["alpha"] > 0)]
    steered_ids = {f"feature.{r.site}.{r.layer}.{r.feature}" for r in steered.itertuples()}
    features = [n["id"] for n in graph["nodes"] if n["kind"] == "feature"]
    feature = next(f for f in features if f in steered_ids)
    page = default_results / "report" / behaviour / "graph.html"
    found = check_page(browser, page, tmp_path, hover=feature, click=feature, edge_share=0.5,
                       node_share=0.5)  # fmt: skip
    assert found["errors"] == []
    assert sorted(found["initial"]["nodes"]) == sorted(n["id"] for n in graph["nodes"])
    assert pairs(found["initial"]["edges"]) == pairs(graph["edges"])
    for state in ("initial", "after_edge", "after_node"):
        geometry = found[f"{state}_geometry"]
        assert geometry["samples"] > 1000 or state != "initial", geometry
        assert geometry["crossings"] == [] and geometry["over_labels"] == [], (state, geometry)
    assert len(found["after_edge_threshold"]["edges"]) < len(found["initial"]["edges"])
    assert len(found["after_node_threshold"]["nodes"]) < len(found["initial"]["nodes"])
    card = found["hover"]
    assert card["contexts"] > 0 and len(card["marks"]) == card["contexts"]
    assert "decoder direction raises the logits of" in card["text"]
    assert feature in found["click"]["nodes_on"]
    # Each feature's text: its index and graph.json's label (cut with "…" when too wide); a
    # click on it opens its card from its dictionary's page of the feature browser in the
    # panel, which opens it with the same label.
    labels = {n["id"]: n["label"] for n in graph["nodes"] if n["kind"] == "feature"}
    assert all(labels.values()), "the features stage labels every feature"
    drawn = {f["id"]: f for f in found["features"]}
    assert set(drawn) == set(labels)
    report = default_results / "report"
    for node_id, f in drawn.items():
        node = Node.parse(node_id)
        full = f"#{node.index} {labels[node_id]}"
        assert f["text"] == full or (f["text"].endswith("…") and full.startswith(f["text"][:-1]))
        target, anchor = f["href"].split("#")
        assert (page.parent / target).resolve() == (
            report / dictionary_page(node.site, node.layer)
        ).resolve()
        assert anchor == node.anchor
    assert card["label"] == f"label: {labels[feature]}" and card["link"] == drawn[feature]["href"]
    panel = found["click"]["panel"]
    assert not panel["hidden"] and panel["src"] == panel["tab"] == drawn[feature]["href"]
    anchor = Node.parse(feature).anchor
    browser_page = page.parent / drawn[feature]["href"].split("#")[0]
    opened = check_page(browser, browser_page, tmp_path, FEATURE_CHECKS_JS, fragment=anchor)
    assert opened["errors"] == [] and opened["opened"]["anchor"] == anchor
    assert opened["opened"]["label"] == labels[feature]
    # The stage's own page (no steering yet) draws the same graph.
    own = check_page(browser, page.parents[2] / "attribution" / behaviour / "graph.html",
                     tmp_path, hover=feature, edge_share=0.5, node_share=0.5)  # fmt: skip
    assert own["errors"] == [] and pairs(own["initial"]["edges"]) == pairs(graph["edges"])
    assert "report's copy of this page" in own["hover"]["text"]
    assert all(f["href"] is None for f in own["features"])  # written before the browser

    for name, pose in {"graph": {}, "card": {"hover": feature, "click": feature}}.items():
        shot = screenshot(browser, page, tmp_path / f"{behaviour}_{name}.png", **pose)
        pixels = matplotlib.image.imread(shot)
        assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05, name
    print(f"screenshots in {tmp_path}")
