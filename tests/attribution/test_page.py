"""graph.html: the attribution stage's page for a tiny spliced model, and the report's copy with
the interventions' steering results, looked at in headless Chromium: no JavaScript errors, the
default thresholds show graph.json's graph, no edge passes through a node it does not connect,
hover cards, path highlighting and the threshold controls."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from helpers.chromium import chromium
from helpers.graph_page import check_page
from helpers.spliced import tiny_spliced, write_feature_dirs
from helpers.summaries import INDUCTION_SUMMARY

from circuitflow.attribution import stage
from circuitflow.attribution.config import AttributionConfig
from circuitflow.attribution.page import browser_href, graph_html, page_data, rounded
from circuitflow.interventions.config import InterventionsConfig
from circuitflow.interventions.flags import flags, flags_of
from circuitflow.interventions.stage import intervene
from circuitflow.nodes import Node, dictionary_page
from circuitflow.report import stage as report_stage


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The attribution stage on the tiny model (its SAEs' features-stage folders, no tokenizer:
    token ids as text), the interventions stage (steering of its top features, the graph's
    nodes as a circuit), the report's page."""
    model, saes, prompts = tiny_spliced(8)
    root = tmp_path_factory.mktemp("graph_page")
    feature_dirs = write_feature_dirs(model, saes, root)
    cfg = AttributionConfig(
        method="atp", validation_features=4, max_graph_nodes=12, edges="all", context_features=2,
        n_contexts=4, validation_edges=8,
    )  # fmt: skip
    attr_dir, iv_dir = root / "attribution" / "b", root / "interventions" / "b"
    stage.attribute(model, prompts, saes, None, cfg, "b", attr_dir, feature_dirs=feature_dirs)
    iv_cfg = InterventionsConfig(n_features=3, n_random_features=1, steering_alphas=(0.0, 2.0),
                                 n_seeds=1, n_random_circuits=1, n_random_sets=1)  # fmt: skip
    summary = intervene(model, prompts, attr_dir, saes, None, iv_cfg, "b", iv_dir)
    report_page = root / "report" / "b" / "graph.html"
    report_stage.graph_page("b", attr_dir, iv_dir, report_page)
    graph = json.loads((attr_dir / "graph.json").read_text())
    return SimpleNamespace(
        root=root,
        attr_dir=attr_dir,
        graph=graph,
        contexts=pd.read_parquet(attr_dir / "feature_contexts.parquet"),
        steering=pd.read_parquet(iv_dir / "steering.parquet"),
        summary=summary,
        report_page=report_page,
        features=[n["id"] for n in graph["nodes"] if n["kind"] == "feature"],
        feature_dirs=feature_dirs,
    )


def edge_pairs(edges) -> list[tuple[str, str]]:
    return sorted((e["source"], e["target"]) if isinstance(e, dict) else tuple(e) for e in edges)


def test_rounded_for_people():
    assert rounded(0.8562005277044854) == "0.856"
    assert rounded(-0.008572335354983807) == "-0.00857"
    assert rounded(6.466249704360962) == "6.47"
    assert rounded(1234.5) == "1230"
    assert rounded(None) == "n/a" and rounded(float("nan")) == "nan"


def test_stage_gives_the_page_every_edge_and_every_feature_contexts(run):
    graph = run.graph
    assert run.features, "the tiny graph should hold SAE features"
    computed = edge_pairs(graph["computed_edges"])
    assert len(computed) == graph["n_edges_computed"] > len(graph["edges"])
    assert set(edge_pairs(graph["edges"])) <= set(computed)
    inner = sum(abs(n["score"]) for n in graph["nodes"] if n["kind"] != "logit")
    assert graph["score_abs_total"] > inner and graph["n_nodes_scored"] > len(graph["nodes"])
    data = page_data(graph, run.contexts, None)
    assert data["edges"] == graph["computed_edges"]
    ctx = run.contexts.assign(
        id=[f"feature.{r.site}.{r.layer}.{r.feature}" for r in run.contexts.itertuples()]
    )
    for node_id in run.features:  # contexts for each of the graph's features, split at the max
        rows = data["contexts"][node_id]
        table = ctx[ctx["id"] == node_id].sort_values("rank")
        assert len(rows) == len(table) > 0
        for row, r in zip(rows, table.itertuples(), strict=True):
            assert row["token"] == r.max_token
            assert f"{row['before']} [[{row['token']}]] {row['after']}" == r.text
    assert data["steering"] is None  # the stage runs before interventions


def test_page_is_self_contained_and_its_header_rounded(run):
    page = (run.attr_dir / "graph.html").read_text()
    assert "<svg" in page and "src=" not in page and "href=" not in page
    assert "https://" not in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    header = page[: page.index('<div id="controls">')]
    spearman = run.graph["validation"]["spearman"]
    assert f"Spearman {rounded(spearman)} " in header and repr(spearman) not in header
    assert f"clean {rounded(run.graph['metric_clean'])}," in header
    # Keys graph.json gains from the stage's validation are shown when present.
    by_kind = {"by_kind": {"head": {"spearman": 0.5, "n_nodes": 4}}}
    extra = run.graph | {
        "edge_validation": {"spearman": 0.91234, "n_edges": 17},
        "validation": run.graph["validation"] | by_kind,
    }
    header = graph_html(extra, "b")
    assert "edge validation: Spearman 0.912 over 17 edges" in header
    assert "validation by kind: head 0.5 (4 nodes)" in header
    # A kind with enough nodes that fails fails the verdict, and the header says which.
    failing = run.graph["validation"] | {"passed": False, "failed_kinds": ["head"],
                                          "min_kind_nodes": 3}  # fmt: skip
    header = graph_html(run.graph | {"validation": failing}, "b")
    assert "(failed, threshold 0.8; head under it, and every kind with at least 3 nodes must " \
        "pass)" in header  # fmt: skip
    # The edge weights: how many are exact, as graph.json says.
    exact = sum(e["weight_source"] == "exact" for e in run.graph["computed_edges"])
    assert 0 < exact == run.graph["n_edges_exact"]
    assert f"exact patching of the direct path for {exact} of " \
        f"{run.graph['n_edges_computed']} computed edges" in page  # fmt: skip


def test_stage_page_in_chromium(run, tmp_path):
    browser = chromium()
    feature = run.features[0]
    found = check_page(browser, run.attr_dir / "graph.html", tmp_path, hover=feature,
                       click=feature, edge_share=0.5, node_share=0.3)  # fmt: skip
    assert found["errors"] == []
    # Each drawn edge says where its weight comes from: exact patching of its direct path
    # (with the fast estimate beside it where that differed) or the fast estimate.
    computed = {(e["source"], e["target"]): e for e in run.graph["computed_edges"]}
    assert found["edge_titles"]
    for source, target, title in found["edge_titles"]:
        e = computed[(source, target)]
        assert f"weight {'+' if e['weight'] > 0 else ''}{rounded(e['weight'])} " in title
        if e["weight_source"] == "exact":
            assert "(exact patching of the direct path" in title
            if rounded(e["weight_fast"]) != rounded(e["weight"]):
                assert f"the fast estimate was {'+' if e['weight_fast'] > 0 else ''}" \
                    f"{rounded(e['weight_fast'])})" in title  # fmt: skip
        else:
            assert "(attribution patching, the fast estimate; not patched exactly)" in title
    sources = {computed[(s, t)]["weight_source"] for s, t, _ in found["edge_titles"]}
    assert sources == {"exact", "atp"}  # both kinds drawn at the default thresholds
    # The default thresholds are the stage's: the page shows graph.json's nodes and edges.
    assert sorted(found["initial"]["nodes"]) == sorted(n["id"] for n in run.graph["nodes"])
    assert edge_pairs(found["initial"]["edges"]) == edge_pairs(run.graph["edges"])
    # The layout: no edge passes through a node it does not connect, or over a label.
    for state in ("initial", "after_edge", "after_node"):
        geometry = found[f"{state}_geometry"]
        assert geometry["samples"] > 100 and geometry["n_circles"] >= 2, state
        assert geometry["crossings"] == [] and geometry["over_labels"] == [], (state, geometry)
    # Moving the thresholds re-prunes in the page.
    n_edges = len(found["initial"]["edges"])
    assert 0 < len(found["after_edge_threshold"]["edges"]) < n_edges
    assert len(found["after_node_threshold"]["nodes"]) < len(found["initial"]["nodes"])
    # The hover card of a feature: its contexts with the peak token marked, no steering yet.
    card = found["hover"]
    assert not card["hidden"] and card["node"] == feature and found["hover_after_leave_hidden"]
    data = page_data(run.graph, run.contexts)
    rows = data["contexts"][feature]
    assert card["contexts"] == len(rows) and card["marks"] == [r["token"] for r in rows]
    assert f"score {rounded(next(n['score'] for n in run.graph['nodes'] if n['id'] == feature))}" \
        in card["text"]  # fmt: skip
    assert "exact activation patching" in card["text"] or "the fast method" in card["text"]
    assert "Spearman" in card["text"] and "report's copy of this page" in card["text"]
    # A click lights the paths through the node: every lit edge joins lit nodes, and the
    # node's own edge to the logit (kept by default) is among them.
    click = found["click"]
    lit = set(click["nodes_on"])
    assert feature in lit and click["card_node"] == feature
    assert all(s in lit and t in lit for s, t in click["edges_on"])
    if (feature, "logit") in edge_pairs(found["initial"]["edges"]):
        assert [feature, "logit"] in click["edges_on"]
    assert found["cleared"]
    # Each feature's label from graph.json (the features stage's); no link: the stage's page
    # is written before the feature browser, so a click on a feature opens no card.
    labels = {n["id"]: n["label"] for n in run.graph["nodes"] if n["kind"] == "feature"}
    assert all(labels.values()) and found["features"]
    for f in found["features"]:
        full = f"#{Node.parse(f['id']).index} {labels[f['id']]}"
        assert f["href"] is None
        assert f["text"] == full or (f["text"].endswith("…") and full.startswith(f["text"][:-1]))
    assert card["label"] == f"label: {labels[feature]}" and card["link"] is None
    assert click["panel"]["hidden"] and click["panel"]["src"] is None


def browser_page_of(page, href: str) -> tuple[dict, str]:
    """The feature browser's dictionary page a graph page's link `href` (relative to `page`)
    lands on (its embedded data) and the link's anchor."""
    target, _, anchor = href.partition("#")
    text = (page.parent / target).read_text()
    return json.loads(re.search(r'id="feature-data">(.*?)</script>', text, re.S)[1]), anchor


def test_features_show_their_labels_and_open_their_cards(run, tmp_path):
    """Each feature's text is its index and its graph.json label (cut with "…" past
    TEXT_MAX, its column widened for it without an edge crossing a label), its card shows the
    label whole, and a click on the feature (its disk or its text) highlights its paths and
    opens its card from its own dictionary's page of the feature browser in the panel."""
    from circuitflow.report.features_page import write_dictionary_page, write_index

    feats = [n for n in run.graph["nodes"] if n["kind"] == "feature"]
    labels = {n["id"]: f'fires on "<t{n["index"]}>" & co' for n in feats}
    long = feats[0]["id"]
    labels[long] = "fires on " + " / ".join(f'"w{k}"' for k in range(30))
    nodes = [n | {"label": labels[n["id"]]} if n["id"] in labels else n for n in run.graph["nodes"]]
    # The browser as the report writes it: an index and a page per dictionary beside it.
    index = tmp_path / "report" / "features.html"
    for folder in run.feature_dirs:
        site, layer = Path(folder).parent.name, int(Path(folder).name.removeprefix("layer_"))
        write_dictionary_page(folder, index.parent / dictionary_page(site, layer))
    write_index(run.feature_dirs, index)
    page = tmp_path / "report" / "b" / "graph.html"
    page.parent.mkdir(parents=True)
    href = browser_href(page, index)
    assert href == "../"
    page.write_text(graph_html(run.graph | {"nodes": nodes}, "b", run.contexts,
                               features_href=href))  # fmt: skip
    # Graph features from two dictionaries: each link must find its own dictionary's page.
    other = next(
        n["id"] for n in feats if (n["site"], n["layer"]) != (feats[0]["site"], feats[0]["layer"])
    )
    found = check_page(chromium(), page, tmp_path, hover=long, click=long, click_text=other,
                       edge_share=0.5, node_share=1)  # fmt: skip
    assert found["errors"] == []
    drawn = {f["id"]: f for f in found["features"]}
    assert set(drawn) == set(labels)
    for node_id, label in labels.items():
        text, full = drawn[node_id]["text"], f"#{Node.parse(node_id).index} {label}"
        if node_id == long:
            assert text.endswith("…") and full.startswith(text[:-1]) and len(text) < len(full)
        else:
            assert text == full
        node = Node.parse(node_id)
        assert drawn[node_id]["href"] == f"../features/{node.site}/layer_{node.layer}.html" \
            f"#{node.anchor}"  # fmt: skip
        # The page it lands on holds this feature's dictionary, and only that one.
        data, anchor = browser_page_of(page, drawn[node_id]["href"])
        assert data["dictionary"]["key"] == f"{node.site}.{node.layer}"
        assert anchor == node.anchor and node.index in data["dictionary"]["features"]["feature"]
    for state in ("initial", "after_edge", "after_node"):
        geometry = found[f"{state}_geometry"]
        assert geometry["crossings"] == [] and geometry["over_labels"] == [], (state, geometry)
    card = found["hover"]
    assert card["label"] == f"label: {labels[long]}"
    assert card["link"] == drawn[long]["href"]
    # A click on the feature's disk: its paths lit, and its card in the panel (with a link to
    # open it in a new tab); clearing the selection closes the panel.
    click = found["click"]
    assert click["card_node"] == long and long in click["nodes_on"]
    assert not click["panel"]["hidden"]
    assert click["panel"]["src"] == click["panel"]["tab"] == drawn[long]["href"]
    assert labels[long] in click["panel"]["title"]
    assert found["cleared"] and found["panel_after_clear"]["hidden"]
    # A click on another dictionary's feature's text: the same, with that dictionary's page.
    by_text = found["click_text"]
    assert by_text["hit_text"] and by_text["selected"] == [other] and by_text["card_node"] == other
    assert not by_text["panel"]["hidden"] and by_text["panel"]["src"] == drawn[other]["href"]
    assert drawn[other]["href"].split("#")[0] != drawn[long]["href"].split("#")[0]


def test_report_page_adds_steering(run, tmp_path):
    steered = run.steering[(run.steering["direction"] == "feature") & (run.steering["alpha"] > 0)]
    ids = {f"feature.{r.site}.{r.layer}.{r.feature}": r for r in steered.itertuples()}
    feature = next(f for f in run.features if f in ids)
    found = check_page(chromium(), run.report_page, tmp_path, hover=feature, edge_share=0.5,
                       node_share=0.3)  # fmt: skip
    assert found["errors"] == []
    text = found["hover"]["text"]
    row = ids[feature]
    assert f"adding {rounded(row.alpha)} × its decoder direction" in text
    tokens = re.findall(r'"([^"]*)" [+-]', text)
    assert tokens == [str(t) for t in row.top_tokens] and len(tokens) > 0
    assert f"logit difference {'+' if row.logit_diff_change > 0 else ''}" \
        f"{rounded(row.logit_diff_change)}" in text  # fmt: skip
    assert np.isfinite(row.logit_diff_change)
    # Steered features outside the graph and unsteered ones in it are said to be so.
    unsteered = [f for f in run.features if f not in ids]
    if unsteered:
        found = check_page(chromium(), run.report_page, tmp_path, hover=unsteered[0],
                           edge_share=0.5, node_share=0.3)  # fmt: skip
        assert "not steered" in found["hover"]["text"]


def test_card_shows_the_validation_of_its_kind(run, tmp_path):
    """With graph.json's per-kind validation the card quotes its own kind's, or says none."""
    by_kind = {"feature": {"spearman": 0.51234, "n_nodes": 7}}
    graph = run.graph | {"validation": run.graph["validation"] | {"by_kind": by_kind}}
    page = tmp_path / "by_kind.html"
    page.write_text(graph_html(graph, "b", run.contexts))
    other = next(n for n in run.graph["nodes"] if n["kind"] not in ("feature", "logit"))
    texts = []
    for node in (run.features[0], other["id"]):
        found = check_page(chromium(), page, tmp_path, hover=node, edge_share=1, node_share=1)
        assert found["errors"] == []
        texts.append(found["hover"]["text"])
    assert "validation on feature nodes: Spearman 0.512 of atp against exact patching over 7 " \
        "nodes" in texts[0]  # fmt: skip
    assert f"validation: graph.json has none for {other['kind']} nodes" in texts[1]


def header_text(page: str) -> str:
    """The page's header as text (the tags dropped, entities read)."""
    import html

    head = page[page.index("<body>") : page.index('<div id="controls">')]
    return html.unescape(re.sub(r"<[^>]+>", " ", head))


def test_report_page_states_the_graph_as_a_circuit_and_the_flags(run):
    """The report's copy states the drawn graph's own faithfulness and completeness as a
    circuit and every flag of the interventions' summary; the attribution stage's page, written
    before interventions run, says where to find them."""
    g = run.summary["graph_circuit"]
    n_graph = sum(n["kind"] != "logit" for n in run.graph["nodes"])
    assert g is not None and 0 < g["n"] <= n_graph
    text = " ".join(header_text(run.report_page.read_text()).split())
    assert f"the graph as a circuit ({n_graph} nodes at the default thresholds" in text
    selection, held_out = rounded(g["faithfulness"]), rounded(g["faithfulness_heldout"])
    assert f"faithfulness {selection} on the selection half, {held_out} held out (threshold " \
        f"0.8); completeness {rounded(g['completeness'])}, " \
        f"{rounded(g['completeness_heldout'])} held out" in text  # fmt: skip
    assert run.summary["flags"] == flags_of(run.summary)
    for flag in run.summary["flags"]:
        assert flag["text"] in text
    if not run.summary["flags"]:
        assert "flags: none" in text
    stage_text = " ".join(header_text((run.attr_dir / "graph.html").read_text()).split())
    assert "the graph as a circuit: its faithfulness and completeness are measured by the " \
        "interventions stage" in stage_text  # fmt: skip
    assert "graph_circuit in interventions/<behaviour>/summary.json" in stage_text
    # With the default run's induction numbers: every flag, and the circuit's own line.
    induction = run.summary | INDUCTION_NUMBERS
    page = graph_html(run.graph, "b", circuit=induction, flags=flags(induction))
    text = " ".join(header_text(page).split())
    expected = flags_of(induction)
    assert len(expected) == 5
    for flag in expected:
        assert flag["text"] in text
    assert "the top 370 nodes by attribution as a circuit: faithfulness 0.825 on the " \
        "selection half, 0.751 held out" in text  # fmt: skip
    none = induction | {"circuit_size": None}
    assert "found no faithful circuit size" in graph_html(run.graph, "b", circuit=none)


# Computed from the numbers (flags.flags) when the page is drawn.
INDUCTION_NUMBERS = INDUCTION_SUMMARY | {"flags": None}
