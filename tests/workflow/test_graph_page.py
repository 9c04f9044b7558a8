"""The default run's attribution graph pages in headless Chromium, as a researcher opens them from
the report (report/{behaviour}/graph.html, with the steering results): no JavaScript errors, the
default thresholds show graph.json's graph, no edge passes through a node it does not connect,
a feature's card shows its contexts and the tokens it promotes, the thresholds re-prune.
Screenshots of each page, plain and with a feature's card open, are left in the test's temporary
directory."""

from __future__ import annotations

import json

import matplotlib.image
import pandas as pd
import pytest
from helpers.chromium import chromium
from helpers.graph_page import check_page, screenshot

pytestmark = pytest.mark.slow


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
    # The stage's own page (no steering yet) draws the same graph.
    own = check_page(browser, page.parents[2] / "attribution" / behaviour / "graph.html",
                     tmp_path, hover=feature, edge_share=0.5, node_share=0.5)  # fmt: skip
    assert own["errors"] == [] and pairs(own["initial"]["edges"]) == pairs(graph["edges"])
    assert "report's copy of this page" in own["hover"]["text"]

    for name, pose in {"graph": {}, "card": {"hover": feature, "click": feature}}.items():
        shot = screenshot(browser, page, tmp_path / f"{behaviour}_{name}.png", **pose)
        pixels = matplotlib.image.imread(shot)
        assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05, name
    print(f"screenshots in {tmp_path}")
