/* attribution/{behaviour}/prompt_graphs.html's script (attribution/prompt_graphs/page.py
   inlines it): draws one prompt's attribution graph from #graph-data as SVG, positions as
   columns and layers as bands, with hover cards and threshold controls. Plain JavaScript;
   nothing is fetched. */
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("graph-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const POS = "#2166ac", NEG = "#b2182b", ERR = "#999999", FEAT = "#ff7f00";
  const TOKEN = "#6a3d9a", LOGIT = "#e31a1c";
  const R = 6; // a node's radius (half an error square's side)
  const COL_MIN = 64; // narrowest position column
  const BAND = 90; // height of a layer's band
  const LEFT = 56, TOP = 24, BOTTOM = 70; // room for band titles, the logit, the tokens

  const svg = document.getElementById("graph");
  const card = document.getElementById("card");
  const select = document.getElementById("prompt");
  const nodeInput = document.getElementById("node-threshold");
  const edgeInput = document.getElementById("edge-threshold");
  const fmt = (x) =>
    x === null || x === undefined || !isFinite(x) ? "n/a" : String(+(+x).toPrecision(3));
  // A clicked feature's card from the feature browser, in a panel (feature_panel.js).
  const BROWSER = featureBrowser(DATA.features_href);

  function svgEl(tag, attrs, parent) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.append(node);
    return node;
  }

  function el(tag, props, children) {
    const node = document.createElement(tag);
    Object.assign(node, props || {});
    for (const c of children || []) node.append(c);
    return node;
  }

  DATA.graphs.forEach((g, k) => {
    const text = g.tokens.slice(1).join(" ");
    select.append(el("option", { value: k, textContent: g.slug + ": " + text.slice(0, 60) }));
  });
  nodeInput.value = DATA.node_threshold;
  edgeInput.value = DATA.edge_threshold;

  // The nodes within the node share (tokens and the logit always), the edges within the edge
  // share among them; then features left without an edge in or out go, until none does.
  function prune(g, nodeShare, edgeShare) {
    let on = new Set(
      g.nodes
        .map((n, k) => [n, k])
        .filter(([n]) => n.kind === "token" || n.kind === "logit" || n.influence <= nodeShare)
        .map(([, k]) => k)
    );
    let edges = [];
    for (;;) {
      edges = g.edges.filter((e) => e.share <= edgeShare && on.has(e.source) && on.has(e.target));
      const hasIn = new Set(edges.map((e) => e.target));
      const hasOut = new Set(edges.map((e) => e.source));
      const next = new Set(
        [...on].filter((k) => {
          const kind = g.nodes[k].kind;
          if (kind === "token" || kind === "logit") return true;
          return hasOut.has(k) && (kind !== "feature" || hasIn.has(k));
        })
      );
      if (next.size === on.size) break;
      on = next;
    }
    return { nodes: [...on].sort((a, b) => a - b), edges: edges };
  }

  // Row of a node: 0 the tokens, layer + 1 its layer's band, n_layers + 1 the logit.
  const row = (g, n) =>
    n.kind === "token" ? 0 : n.kind === "logit" ? g.n_layers + 1 : n.layer + 1;

  function layout(g, vis) {
    const width = document.getElementById("graph-scroll").clientWidth - 2;
    const col = Math.max(COL_MIN, (width - LEFT - 10) / g.tokens.length);
    const rows = g.n_layers + 2;
    const height = TOP + rows * BAND + BOTTOM;
    const cells = new Map();
    for (const k of vis.nodes) {
      const n = g.nodes[k];
      const key = row(g, n) + ":" + n.pos;
      if (!cells.has(key)) cells.set(key, []);
      cells.get(key).push(k);
    }
    const pos = new Map();
    for (const [key, members] of cells) {
      const [r, p] = key.split(":").map(Number);
      // Most influential first; errors last; spread evenly inside the column.
      members.sort((a, b) => g.nodes[a].influence - g.nodes[b].influence);
      const step = Math.min(3 * R, (col - 2 * R) / Math.max(1, members.length));
      const x0 = LEFT + p * col + col / 2 - (step * (members.length - 1)) / 2;
      const y = TOP + (rows - 1 - r) * BAND + BAND / 2;
      members.forEach((k, j) => pos.set(k, { x: x0 + j * step, y: y, col: p, row: r }));
    }
    return { col: col, width: LEFT + col * g.tokens.length + 10, height: height, pos: pos };
  }

  function showCard(evt, parts) {
    card.replaceChildren(...parts);
    card.hidden = false;
    const x = Math.min(evt.clientX + 14, BROWSER.edge() - 420);
    card.style.left = x + "px";
    card.style.top = Math.min(evt.clientY + 14, window.innerHeight - 200) + "px";
  }

  function nodeTitle(g, n) {
    const at = ' at position ' + n.pos + ' "' + g.tokens[n.pos] + '"';
    if (n.kind === "feature") return "feature L" + n.layer + " #" + n.feature + at;
    if (n.kind === "error") return "error node L" + n.layer + at;
    if (n.kind === "token") return "token" + at;
    return "logit difference (the behaviour's metric)";
  }

  function nodeCard(evt, g, n) {
    const parts = [el("h3", { textContent: nodeTitle(g, n) })];
    if (n.kind === "feature") {
      parts.push(el("p", { className: "feature-label", textContent: n.label ?
        "label: " + n.label : "label: none (no features stage for this transcoder)" }));
      if (n.neuronpedia) {
        parts.push(el("p", { className: "neuronpedia", textContent: "on Neuronpedia: " +
          n.neuronpedia + (BROWSER.href(n) ? " (click: linked beside its card)" :
          " (click: opens it)") }));
      }
      if (BROWSER.href(n)) {
        parts.push(el("p", { textContent: "click: its card from the feature browser beside " +
          "the graph (" + n.anchor + ")" }));
      } else if (DATA.features_href) {
        // Embedded in the Snakemake report: the browser's pages cannot be reached from here.
        parts.push(el("p", { className: "none", textContent: "its card: report/" + n.card +
          " in the results folder (this copy cannot open it)" }));
      }
      parts.push(el("p", { textContent: "activation " + fmt(n.activation) }));
    }
    if (n.kind !== "logit") {
      parts.push(el("p", { textContent: "influence: cumulative share " + fmt(n.influence) }));
    } else {
      parts.push(el("p", { textContent: "value " + fmt(g.metric) }));
    }
    if (n.kind === "feature") {
      const rows = DATA.contexts[n.context] || [];
      parts.push(el("p", { className: "section", textContent: "top activating contexts" }));
      if (!rows.length) parts.push(el("p", { className: "none", textContent: "none found" }));
      else {
        parts.push(el("ol", {}, rows.map((c) =>
          el("li", {}, [el("span", { className: "act", textContent: fmt(c.activation) }),
            c.before + " ", el("mark", { textContent: c.token }), " " + c.after]))));
      }
    }
    showCard(evt, parts);
  }

  function edgeCard(evt, g, e) {
    const s = g.nodes[e.source], t = g.nodes[e.target];
    const parts = [
      el("h3", { textContent: nodeTitle(g, s) + " \u2192 " + nodeTitle(g, t) }),
      el("p", { textContent: "weight " + fmt(e.weight) + " (direct effect on the target's input)" }),
    ];
    if (e.heads && e.heads.length) {
      parts.push(el("p", { className: "section", textContent: "carried by heads" }));
      parts.push(el("ol", {}, e.heads.map((h) =>
        el("li", { className: "head", textContent: "L" + h.layer + ".H" + h.head + ": " +
          fmt(h.weight) + " (" + fmt((100 * h.weight) / e.weight) + "% of the edge)" }))));
    }
    showCard(evt, parts);
  }

  function draw() {
    const g = DATA.graphs[+select.value];
    const nodeShare = +nodeInput.value, edgeShare = +edgeInput.value;
    document.getElementById("node-value").textContent = fmt(nodeShare);
    document.getElementById("edge-value").textContent = fmt(edgeShare);
    const vis = prune(g, nodeShare, edgeShare);
    const L = layout(g, vis);
    svg.replaceChildren();
    svg.setAttribute("width", L.width);
    svg.setAttribute("height", L.height);
    const rows = g.n_layers + 2;
    for (let r = 0; r < rows; r++) {
      const y = TOP + (rows - 1 - r) * BAND;
      svgEl("rect", { class: "band" + (r % 2 ? " odd" : ""), x: 0, y: y, width: L.width,
        height: BAND }, svg);
      const name = r === 0 ? "Emb" : r === rows - 1 ? "Logit" : "L" + (r - 1);
      svgEl("text", { class: "layer-title", x: LEFT / 2, y: y + BAND / 2 + 4 }, svg).textContent = name;
    }
    g.tokens.forEach((tok, p) => {
      const x = LEFT + p * L.col + L.col / 2;
      const label = svgEl("text", { class: "token-label", x: x, y: TOP + rows * BAND + 16,
        "text-anchor": "middle", "data-pos": p }, svg);
      label.textContent = tok;
    });
    const wMax = Math.max(1e-12, ...vis.edges.map((e) => Math.abs(e.weight)));
    for (const e of vis.edges) {
      const a = L.pos.get(e.source), b = L.pos.get(e.target);
      const mid = (a.y + b.y) / 2;
      const path = svgEl("path", {
        class: "edge", d: `M ${a.x} ${a.y} C ${a.x} ${mid} ${b.x} ${mid} ${b.x} ${b.y}`,
        stroke: e.weight < 0 ? NEG : POS, "stroke-width": 0.6 + (4.4 * Math.abs(e.weight)) / wMax,
        "data-heads": e.heads ? e.heads.length : 0,
      }, svg);
      path.addEventListener("mousemove", (evt) => edgeCard(evt, g, e));
      path.addEventListener("mouseleave", () => (card.hidden = true));
    }
    for (const k of vis.nodes) {
      const n = g.nodes[k], p = L.pos.get(k);
      const grp = svgEl("g", { class: "node " + n.kind, "data-kind": n.kind, "data-pos": n.pos,
        "data-row": p.row }, svg);
      // A click on a feature opens its card from the feature browser beside the graph.
      const href = n.kind === "feature" ? BROWSER.href(n) : null;
      if (href) {
        grp.classList.add("linked");
        grp.dataset.card = href;
        grp.addEventListener("click", () => BROWSER.open(n, nodeTitle(g, n) + ": " +
          (n.label || "no label")));
      } else if (n.kind === "feature" && n.neuronpedia) {
        // No feature browser to open: its Neuronpedia page instead.
        grp.classList.add("linked");
        grp.addEventListener("click", () => window.open(n.neuronpedia, "_blank"));
      }
      const colour = { feature: FEAT, error: ERR, token: TOKEN, logit: LOGIT }[n.kind];
      if (n.kind === "error") {
        svgEl("rect", { x: p.x - R, y: p.y - R, width: 2 * R, height: 2 * R, fill: colour }, grp);
      } else {
        svgEl("circle", { cx: p.x, cy: p.y, r: n.kind === "feature" ? R : R + 2, fill: colour }, grp);
      }
      grp.addEventListener("mousemove", (evt) => nodeCard(evt, g, n));
      grp.addEventListener("mouseleave", () => (card.hidden = true));
    }
    const counts = {};
    vis.nodes.forEach((k) => (counts[g.nodes[k].kind] = (counts[g.nodes[k].kind] || 0) + 1));
    document.getElementById("counts").textContent =
      (counts.feature || 0) + " features, " + (counts.error || 0) + " error nodes, " +
      vis.edges.length + " edges shown";
    const s = g.summary, v = g.validation;
    document.getElementById("scores").textContent =
      "logit difference " + fmt(g.metric) + "; replacement score " + fmt(s.replacement_score) +
      ", completeness " + fmt(s.completeness_score) + "; pruned graph faithfulness " +
      fmt(v.faithfulness) + "; predicted vs measured feature ablations: Spearman " +
      fmt(v.spearman) + " (" + fmt(v.spearman_frozen_norms) + " with norms frozen)" +
      (v.passed === false ? " \u2014 flagged" : "");
  }

  select.addEventListener("change", draw);
  nodeInput.addEventListener("input", draw);
  edgeInput.addEventListener("input", draw);
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    card.hidden = true;
    BROWSER.close();
  });
  window.__draw = draw; // the page's tests redraw after setting the controls
  draw();
})();
