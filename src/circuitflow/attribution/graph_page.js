/* graph.html's script (page.py inlines it): prunes, lays out and draws the attribution graph
   held in #graph-data as SVG, with hover cards, path highlighting and threshold controls.
   Plain JavaScript; nothing is fetched. */
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("graph-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const POS = "#2166ac", NEG = "#b2182b";
  const R_MIN = 5, R_MAX = 18;
  const HALF = R_MAX + 8; // half a column's narrowest width: every node disk stays inside it
  // A feature's text (index and label) widens its column up to this, then ends in "…".
  const TEXT_MAX = 190;
  // Between two columns: edges bend only here, where no node is. As wide as fits the window,
  // within these bounds (the page scrolls sideways beyond).
  const CORRIDOR_MIN = 60, CORRIDOR_MAX = 110;
  const LABEL = 13; // the band above a node that holds its label; no edge crosses it
  const CLEAR = 4; // clearance between an edge routed through a column and its nodes
  const LANE = 2; // space between neighbouring edges routed through the same gap
  const GAP = 14; // smallest gap between neighbouring nodes of a column
  const MAX_GAP = 120; // largest: more edges than fit share lanes rather than stretch the page
  const HALF_STROKE = 3; // half the widest edge stroke (edgeWidth's maximum is 6)
  const TOP = 40; // room for the layer and column titles
  const SIDE = 16;

  const nodes = DATA.nodes;
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const edges = DATA.edges
    .filter((e) => byId.has(e.source) && byId.has(e.target))
    .map((e, i) => Object.assign({ i: i }, e));
  const sMax = Math.max(1e-12, ...nodes.map((n) => Math.abs(n.score)));
  const wMax = Math.max(1e-12, ...edges.map((e) => Math.abs(e.weight)));
  const inner = nodes.filter((n) => n.kind !== "logit");
  const scoreTotal = DATA.score_abs_total || inner.reduce((s, n) => s + Math.abs(n.score), 0);
  const covered = inner.reduce((s, n) => s + Math.abs(n.score), 0) / scoreTotal;

  const fmt = (x) =>
    x === null || x === undefined || !isFinite(x) ? "n/a" : String(+(+x).toPrecision(3));
  const signed = (x) => (x > 0 ? "+" : "") + fmt(x);
  const radius = (n) => R_MIN + (R_MAX - R_MIN) * Math.sqrt(Math.abs(n.score) / sMax);
  const signColour = (x) => (x < 0 ? NEG : POS);
  const edgeWidth = (e) => 0.6 + (5.4 * Math.abs(e.weight)) / wMax;
  // A clicked feature's card from the feature browser, in a panel (feature_panel.js).
  const BROWSER = featureBrowser(DATA.features_href);

  function el(tag, props, children) {
    const node = document.createElement(tag);
    Object.assign(node, props || {});
    for (const c of children || []) node.append(c);
    return node;
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  // The text above a node: a feature's index and label (its column widens for it, up to
  // TEXT_MAX, cut with "…" beyond), the short name of any other node.
  const fullText = (n) => (n.feature_label ? n.label + " " + n.feature_label : n.label);
  const fitted = new Map(); // node id -> [text, width]
  function fitText(n) {
    if (fitted.has(n.id)) return fitted.get(n.id);
    const probe = svgEl("g", { class: "node" });
    const t = svgEl("text", {});
    probe.append(t);
    svg.append(probe);
    let text = fullText(n);
    t.textContent = text;
    while (t.getComputedTextLength() > TEXT_MAX && text.length > n.label.length) {
      text = text.slice(0, -1);
      t.textContent = text.trimEnd() + "…";
    }
    const out = [t.textContent, t.getComputedTextLength()];
    probe.remove();
    fitted.set(n.id, out);
    return out;
  }

  // ---- Pruning: circuit-tracer's cumulative rule, as graph.py's cumulative_keep -------------

  // The largest |value|s until `share` of `total` is covered (at least one item).
  function cumulativeKeep(items, value, share, total) {
    const order = items.slice().sort((a, b) => Math.abs(value(b)) - Math.abs(value(a)));
    if (!order.length || !(total > 0)) return order.slice(0, 1);
    const kept = [];
    let sum = 0;
    for (const item of order) {
      kept.push(item);
      sum += Math.abs(value(item));
      if (sum / total >= share - 1e-12) break;
    }
    return kept;
  }

  // Nodes by |score| as a share of every scored node's |score| (the stage's rule, so the default
  // shows graph.json's nodes), and the bridges (graph.py: an SAE's nodes that carry the paths
  // across it); then edges among them by |weight| as a share of theirs, the bridges' edges and
  // the others each ranked among themselves (graph.py's kept_edges).
  function prune(nodeShare, edgeShare) {
    const ranked = inner.filter((n) => !n.bridge);
    const kept = cumulativeKeep(ranked, (n) => n.score, nodeShare, scoreTotal);
    const ids = new Set(kept.map((n) => n.id));
    nodes.forEach((n) => (n.kind === "logit" || n.bridge) && ids.add(n.id));
    const bridges = new Set(nodes.filter((n) => n.bridge).map((n) => n.id));
    const among = edges.filter((e) => ids.has(e.source) && ids.has(e.target));
    const keptEdges = [];
    for (const group of [true, false]) {
      const members = among.filter((e) => (bridges.has(e.source) || bridges.has(e.target)) === group);
      const total = members.reduce((s, e) => s + Math.abs(e.weight), 0);
      if (members.length) keptEdges.push(...cumulativeKeep(members, (e) => e.weight, edgeShare, total));
    }
    return {
      nodes: nodes.filter((n) => ids.has(n.id)),
      edges: keptEdges.sort((a, b) => a.i - b.i),
      nodeCover: kept.reduce((s, n) => s + Math.abs(n.score), 0) / scoreTotal,
      edgesAmong: among.length,
    };
  }

  // ---- Layout: columns in forward-pass order, edges routed through gaps ---------------------

  // A gap holding edges of total width (lanes included) `lanes`.
  const slotHeight = (lanes) => Math.min(MAX_GAP, Math.max(GAP, lanes + 2 * CLEAR));

  // y of every node and the free intervals (slots) of every column: slot k lies above node k's
  // label, the last one below the last node; each is tall enough for the edges routed through it.
  function place(cols, pos) {
    let bottom = 0;
    for (const c of cols) {
      let y = TOP;
      c.slots = [];
      c.nodes.forEach((n, k) => {
        const h = slotHeight(c.lanes[k]);
        c.slots.push([y, y + h]);
        const p = pos.get(n.id);
        p.y = y + h + LABEL + p.r;
        y = p.y + p.r;
      });
      c.slots.push([y, y + slotHeight(c.lanes[c.nodes.length])]);
      bottom = Math.max(bottom, y + slotHeight(c.lanes[c.nodes.length]));
    }
    // The embedding and the logit, alone in their columns, sit level with the middle.
    for (const c of cols) {
      if (c.nodes.length !== 1 || !["embedding", "logit"].includes(c.nodes[0].kind)) continue;
      const p = pos.get(c.nodes[0].id);
      const shift = Math.max(0, (TOP + bottom) / 2 - p.y);
      p.y += shift;
      c.slots[0][1] += shift;
      c.slots[1] = [c.slots[1][0] + shift, c.slots[1][1] + shift];
    }
    return bottom;
  }

  // The slot of column `c` nearest to height `want` (the last slot is open downwards).
  function nearestSlot(c, want) {
    let best = 0, bestDist = Infinity;
    c.slots.forEach(([lo, hi], k) => {
      const open = k === c.slots.length - 1;
      const dist = want < lo ? lo - want : want > hi && !open ? want - hi : 0;
      if (dist < bestDist) [best, bestDist] = [k, dist];
    });
    return best;
  }

  function layout(vis) {
    const cols = [], byKey = new Map();
    for (const n of vis.nodes) {
      const key = n.layer + "|" + n.order;
      if (!byKey.has(key)) {
        byKey.set(key, { layer: n.layer, order: n.order, name: n.column, kind: n.kind, nodes: [] });
        cols.push(byKey.get(key));
      }
      byKey.get(key).nodes.push(n);
    }
    cols.sort((a, b) => a.order - b.order || a.layer - b.layer);
    // Each column as wide as its widest text (no edge crosses a column's text band).
    for (const c of cols) {
      c.half = Math.max(HALF, ...c.nodes.map((n) => fitText(n)[1] / 2 + 3));
    }
    const columns = cols.reduce((s, c) => s + 2 * c.half, 0);
    const room = document.getElementById("graph-scroll").clientWidth - 2 * SIDE - 2;
    const fit = (room - columns) / Math.max(1, cols.length - 1);
    const corridor = Math.min(CORRIDOR_MAX, Math.max(CORRIDOR_MIN, fit));
    const pos = new Map();
    let left = SIDE;
    cols.forEach((c, ci) => {
      c.x = left + c.half;
      left += 2 * c.half + corridor;
      c.nodes.sort((a, b) => Math.abs(b.score) - Math.abs(a.score) || (a.id < b.id ? -1 : 1));
      c.nodes.forEach((n) => pos.set(n.id, { x: c.x, r: radius(n), col: ci }));
      c.lanes = new Array(c.nodes.length + 1).fill(0);
    });
    place(cols, pos);
    // An edge crosses each column strictly between its ends through the gap nearest to the
    // straight line between them; gaps then widen for the edges they carry.
    const lineAt = (rt, x) => rt.a.y + ((x - rt.a.x) / (rt.b.x - rt.a.x)) * (rt.b.y - rt.a.y);
    const routes = vis.edges.map((e) => {
      let a = pos.get(e.source), b = pos.get(e.target);
      if (a.col > b.col) [a, b] = [b, a];
      const rt = { e: e, a: a, b: b, via: [] };
      for (let ci = a.col + 1; ci < b.col; ci++) {
        const slot = nearestSlot(cols[ci], lineAt(rt, cols[ci].x));
        cols[ci].lanes[slot] += edgeWidth(e) + LANE;
        rt.via.push({ ci: ci, slot: slot });
      }
      return rt;
    });
    const bottom = place(cols, pos);
    // Edges through one gap are spread evenly, in the order their straight lines cross it, each
    // in a lane as wide as its stroke; lanes are squeezed (strokes may overlap, never leaving
    // the gap) when the gap is at its largest.
    const gaps = new Map();
    for (const rt of routes) {
      for (const v of rt.via) {
        v.want = lineAt(rt, cols[v.ci].x);
        v.lane = edgeWidth(rt.e) + LANE;
        const key = v.ci + ":" + v.slot;
        if (!gaps.has(key)) gaps.set(key, []);
        gaps.get(key).push(v);
      }
    }
    for (const vs of gaps.values()) {
      const [lo, hi] = cols[vs[0].ci].slots[vs[0].slot];
      vs.sort((p, q) => p.want - q.want);
      const used = vs.reduce((s, v) => s + v.lane, 0);
      const room = hi - lo - 2 * CLEAR;
      if (used > room) {
        const top = lo + CLEAR + HALF_STROKE, span = room - 2 * HALF_STROKE;
        let before = 0;
        vs.forEach((v) => {
          v.y = top + (span * (before + v.lane / 2)) / used;
          before += v.lane;
        });
        continue;
      }
      const pad = (room - used) / (vs.length + 1);
      let y = lo + CLEAR;
      vs.forEach((v) => {
        y += pad;
        v.y = y + v.lane / 2;
        y += v.lane;
      });
    }
    routes.forEach((rt) => (rt.d = pathOf(rt, cols, corridor)));
    const width = 2 * SIDE + columns + Math.max(0, cols.length - 1) * corridor;
    return { cols: cols, pos: pos, routes: routes, bottom: bottom, width: width };
  }

  // Horizontal inside every column it touches (at its node, or in a gap), a cubic bend between
  // columns whose control points share the corridor's x range: no node is ever crossed.
  function pathOf(rt, cols, corridor) {
    const f = (x) => x.toFixed(1);
    const { a, b } = rt;
    const half = (p) => cols[p.col].half;
    if (a.col === b.col) {
      // Same column (not made by the stage today): a loop out into the corridor on the right.
      const x = a.x + half(a), bend = x + corridor / 3;
      return `M${f(a.x)},${f(a.y)}H${f(x)}C${f(bend)},${f(a.y)} ${f(bend)},${f(b.y)} ` +
        `${f(x)},${f(b.y)}H${f(b.x)}`;
    }
    const pts = [{ x0: a.x, x1: a.x + half(a), y: a.y }];
    for (const v of rt.via) {
      const c = cols[v.ci];
      pts.push({ x0: c.x - c.half, x1: c.x + c.half, y: v.y });
    }
    pts.push({ x0: b.x - half(b), x1: b.x, y: b.y });
    let d = `M${f(a.x)},${f(a.y)}H${f(pts[0].x1)}`;
    for (let k = 1; k < pts.length; k++) {
      const p = pts[k - 1], q = pts[k], mid = (p.x1 + q.x0) / 2;
      d += `C${f(mid)},${f(p.y)} ${f(mid)},${f(q.y)} ${f(q.x0)},${f(q.y)}H${f(q.x1)}`;
    }
    return d;
  }

  // ---- Drawing ------------------------------------------------------------------------------

  const svg = document.getElementById("graph");
  const state = { vis: null, selected: null, pinned: null };

  function bandTitle(c) {
    if (c.kind === "embedding") return "embedding";
    if (c.kind === "logit") return "logit";
    return "layer " + c.layer;
  }

  function draw() {
    const { cols, pos, routes, bottom, width } = layout(state.vis);
    svg.textContent = "";
    const height = bottom + 16;
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    // One band per layer, titled; each column named under it where the name adds something.
    const bands = [];
    for (const c of cols) {
      const last = bands[bands.length - 1];
      if (last && bandTitle(last.cols[0]) === bandTitle(c)) last.cols.push(c);
      else bands.push({ cols: [c] });
    }
    bands.forEach((band, k) => {
      const first = band.cols[0], last = band.cols[band.cols.length - 1];
      const x0 = first.x - first.half - 10, x1 = last.x + last.half + 10;
      svg.append(svgEl("rect", {
        class: "band" + (k % 2 ? " odd" : ""), x: x0, y: 2, width: x1 - x0, height: height - 4,
        rx: 6,
      }));
      const title = svgEl("text", { class: "layer-title", x: (x0 + x1) / 2, y: 16 });
      title.textContent = bandTitle(band.cols[0]);
      svg.append(title);
    });
    for (const c of cols) {
      if (c.kind === "embedding" || c.kind === "logit") continue;
      const t = svgEl("text", { class: "column-title", x: c.x, y: 30 });
      t.textContent = c.name;
      svg.append(t);
    }
    const edgeLayer = svgEl("g", { id: "edges" }), nodeLayer = svgEl("g", { id: "nodes" });
    svg.append(edgeLayer, nodeLayer);
    for (const rt of routes) {
      const e = rt.e;
      const path = svgEl("path", {
        class: "edge", d: rt.d, stroke: signColour(e.weight),
        "stroke-width": edgeWidth(e).toFixed(2),
        "data-source": e.source, "data-target": e.target,
      });
      const tip = svgEl("title");
      tip.textContent = `${byId.get(e.source).name} → ${byId.get(e.target).name}: ` +
        `weight ${signed(e.weight)}${weightSourceText(e)}`;
      path.append(tip);
      edgeLayer.append(path);
    }
    for (const n of state.vis.nodes) {
      const p = pos.get(n.id);
      const g = svgEl("g", { class: "node", "data-id": n.id });
      if (n.kind === "feature") g.classList.add("feature");
      const circle = svgEl("circle", {
        cx: p.x.toFixed(1), cy: p.y.toFixed(1), r: p.r.toFixed(1),
        fill: DATA.colours[n.kind], stroke: signColour(n.score),
      });
      if (n.bridge) circle.setAttribute("stroke-dasharray", "3 2");
      g.append(circle);
      const label = svgEl("text", { x: p.x.toFixed(1), y: (p.y - p.r - 4).toFixed(1) });
      label.textContent = fitText(n)[0];
      g.append(label);
      // A click on a feature (disk or text) also opens its card from the feature browser.
      const href = n.kind === "feature" ? BROWSER.href(n) : null;
      if (href) {
        g.classList.add("linked");
        g.dataset.card = href;
      }
      g.addEventListener("mouseenter", () => showCard(n, g));
      g.addEventListener("mouseleave", showPinned);
      g.addEventListener("click", (ev) => {
        ev.stopPropagation();
        state.pinned = n.id;
        select(n.id);
        showCard(n, g);
        if (!href || !BROWSER.open(n, `${n.name}: ${n.feature_label || "no label"}`)) {
          BROWSER.close();
        }
      });
      nodeLayer.append(g);
    }
    highlight();
  }

  // ---- Path highlighting --------------------------------------------------------------------

  function reach(start, next) {
    const seen = new Set(), todo = [start];
    while (todo.length) {
      for (const m of next.get(todo.pop()) || []) {
        if (!seen.has(m)) {
          seen.add(m);
          todo.push(m);
        }
      }
    }
    return seen;
  }

  // The selected node's upstream paths into it and its downstream paths to the logit, over the
  // edges shown; everything else is dimmed.
  function highlight() {
    const id = state.selected;
    svg.classList.toggle("selecting", id !== null);
    if (id === null) {
      svg.querySelectorAll(".on, .selected").forEach((x) => x.classList.remove("on", "selected"));
      return;
    }
    const out = new Map(), inc = new Map();
    for (const e of state.vis.edges) {
      (out.get(e.source) || out.set(e.source, []).get(e.source)).push(e.target);
      (inc.get(e.target) || inc.set(e.target, []).get(e.target)).push(e.source);
    }
    const up = reach(id, inc), down = reach(id, out), toLogit = reach("logit", inc);
    toLogit.add("logit");
    const onDown = (x) => down.has(x) && toLogit.has(x);
    const on = new Set([id, ...up, ...[...down].filter(onDown)]);
    svg.querySelectorAll(".node").forEach((g) => {
      g.classList.toggle("on", on.has(g.dataset.id));
      g.classList.toggle("selected", g.dataset.id === id);
    });
    svg.querySelectorAll(".edge").forEach((p) => {
      const s = p.dataset.source, t = p.dataset.target;
      const upstream = up.has(s) && (up.has(t) || t === id);
      const downstream = (s === id || down.has(s)) && onDown(t);
      p.classList.toggle("on", upstream || downstream);
    });
  }

  function select(id) {
    state.selected = id;
    highlight();
  }

  function clearSelection() {
    state.selected = null;
    state.pinned = null;
    BROWSER.close();
    highlight();
    hideCard();
  }

  // ---- Hover card ---------------------------------------------------------------------------

  const card = document.getElementById("card");

  // Where an edge's weight comes from (graph.json's weight_source; older files have none).
  function weightSourceText(e) {
    if (!e.weight_source) return "";
    const names = { ig: "integrated gradients", atp: "attribution patching" };
    if (e.weight_source !== "exact") {
      return ` (${names[e.weight_source] || e.weight_source}, the fast estimate; not patched ` +
        "exactly)";
    }
    const fast = e.weight_fast;
    const differs = fast !== undefined && fast !== null && fmt(fast) !== fmt(e.weight);
    return " (exact patching of the direct path" +
      (differs ? `; the fast estimate was ${signed(fast)})` : ")");
  }

  function sourceText(src) {
    if (src === "exact") return "exact activation patching";
    if (src === "metric") return "the metric itself, clean − corrupted";
    const names = { ig: "integrated gradients", atp: "attribution patching" };
    return `${names[src] || src}, the fast method (not patched exactly)`;
  }

  function validationText(kind) {
    const v = DATA.validation || {};
    const byKind = v.by_kind;
    const method = v.method || DATA.method;
    if (byKind && byKind[kind]) {
      const k = byKind[kind];
      return `validation on ${kind} nodes: Spearman ${fmt(k.spearman)} of ${method} against ` +
        `exact patching over ${k.n_nodes} nodes`;
    }
    if (byKind) return `validation: graph.json has none for ${kind} nodes`;
    return `validation (all kinds together): Spearman ${fmt(v.spearman)} of ${method} against ` +
      `exact patching over ${v.n_nodes === undefined ? "n/a" : v.n_nodes} nodes`;
  }

  function where(n) {
    const parts = [`kind ${n.kind}`];
    if (n.kind === "embedding") parts.push("before layer 0");
    else if (n.kind === "logit") parts.push("after the last layer");
    else parts.push(`layer ${n.layer}`);
    if (n.kind === "head" || n.kind === "feature") parts.push(`index ${n.index}`);
    if (n.site) parts.push(`site ${n.site}`);
    return parts.join(" · ");
  }

  function edgeList(title, list, other) {
    if (!list.length) return [];
    list.sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight));
    const shown = list.slice(0, 3).map((e) => `${byId.get(other(e)).name} ${signed(e.weight)}`);
    return [el("p", { textContent: `${title} (${list.length} shown): ${shown.join(", ")}` +
      (list.length > 3 ? ", …" : "") })];
  }

  function contextItems(n) {
    const rows = DATA.contexts[n.id];
    if (!rows || !rows.length) {
      return [el("p", { className: "none", textContent: "no contexts recorded for this feature" })];
    }
    return [el("ol", {}, rows.map((r) => el("li", {}, [
      el("span", { className: "act", textContent: fmt(r.activation) }),
      r.before + (r.before ? " " : ""),
      el("mark", { textContent: r.token }),
      (r.after ? " " : "") + r.after,
    ])))];
  }

  // A feature's label and the way to its card in the feature browser.
  function labelItems(n) {
    const parts = [el("p", { className: "feature-label", textContent: n.feature_label ?
      "label: " + n.feature_label : "label: none (no features stage for this dictionary)" })];
    if (n.neuronpedia) {
      parts.push(el("p", {}, [el("a", { className: "neuronpedia", href: n.neuronpedia,
        target: "_blank", textContent: "its page on Neuronpedia" })]));
    }
    const href = BROWSER.href(n);
    if (href) {
      parts.push(el("p", {}, ["click: its card beside the graph; ", el("a", {
        className: "browser", href: href, target: "_blank",
        textContent: "open it in a new tab (" + n.anchor + ")" })]));
    } else if (DATA.features_href) {
      // Embedded in the Snakemake report: the browser's pages cannot be reached from here.
      parts.push(el("p", { className: "none", textContent: "its card: report/" + n.card +
        " in the results folder (this copy cannot open it)" }));
    }
    return parts;
  }

  function steeringItems(n) {
    if (DATA.steering === null) {
      return [el("p", { className: "none", textContent: "the interventions stage runs after " +
        "attribution: the report's copy of this page (report/<behaviour>/graph.html) adds the " +
        "tokens this feature promotes when steered" })];
    }
    const s = DATA.steering[n.id];
    if (!s) {
      return [el("p", { className: "none", textContent: "not steered (the interventions stage " +
        "steers its top features by |score| only)" })];
    }
    const tokens = s.tokens.map((t, k) => `${JSON.stringify(t)} ${signed(s.changes[k])}`);
    const control = s.random_logit_diff_change === null ? "" :
      ` (a random direction of the same norm: ${signed(s.random_logit_diff_change)})`;
    return [
      el("p", { textContent: `adding ${fmt(s.alpha)} × its decoder direction raises the logits ` +
        `of ${tokens.join(", ")}` }),
      el("p", { textContent: `logit difference ${signed(s.logit_diff_change)}${control}` }),
    ];
  }

  function showCard(n, g) {
    const swatch = el("span", { className: "swatch" });
    swatch.style.background = DATA.colours[n.kind];
    const name = n.name === n.id ? n.id : `${n.name}  (${n.id})`;
    const parts = [el("h3", {}, [swatch, name])];
    if (n.kind === "feature") parts.push(...labelItems(n));
    parts.push(
      el("p", { textContent: where(n) }),
      el("p", { textContent: `score ${fmt(n.score)}: ${sourceText(n.score_source)}` }),
    );
    if (n.bridge) {
      parts.push(el("p", { textContent: "bridge: kept because paths between the graph's " +
        "nodes cross its SAE, none of whose nodes made the cut on its own" }));
    }
    if (n.kind === "logit") {
      parts.push(el("p", { textContent: `logit difference clean ${fmt(DATA.metric_clean)}, ` +
        `corrupted ${fmt(DATA.metric_corrupted)}` }));
    } else {
      parts.push(el("p", { textContent: validationText(n.kind) }));
    }
    const shown = state.vis.edges;
    parts.push(...edgeList("strongest inputs", shown.filter((e) => e.target === n.id),
      (e) => e.source));
    parts.push(...edgeList("strongest outputs", shown.filter((e) => e.source === n.id),
      (e) => e.target));
    if (n.kind === "feature") {
      parts.push(el("p", { className: "section", textContent: "top-activating contexts " +
        "(activation, the token it peaks on marked)" }), ...contextItems(n));
      parts.push(el("p", { className: "section", textContent: "steering" }), ...steeringItems(n));
    }
    card.replaceChildren(...parts);
    card.dataset.node = n.id;
    card.hidden = false;
    // Beside the node, inside the window (left of the feature panel when it is open).
    const box = g.querySelector("circle").getBoundingClientRect();
    const w = card.offsetWidth, h = card.offsetHeight;
    let left = box.right + 12;
    if (left + w > BROWSER.edge() - 8) left = Math.max(8, box.left - w - 12);
    const top = Math.min(Math.max(8, box.top - 8), Math.max(8, window.innerHeight - h - 8));
    card.style.left = left + "px";
    card.style.top = top + "px";
  }

  // The clicked node's card stays until the selection is cleared.
  function showPinned() {
    const g = state.pinned && svg.querySelector(`.node[data-id="${CSS.escape(state.pinned)}"]`);
    if (g) showCard(byId.get(state.pinned), g);
    else hideCard();
  }

  function hideCard() {
    card.hidden = true;
    delete card.dataset.node;
  }

  // ---- Controls and legend ------------------------------------------------------------------

  const nodeInput = document.getElementById("node-threshold");
  const edgeInput = document.getElementById("edge-threshold");

  function update() {
    const nodeShare = +nodeInput.value, edgeShare = +edgeInput.value;
    document.getElementById("node-value").textContent = fmt(nodeShare);
    document.getElementById("edge-value").textContent = fmt(edgeShare);
    state.vis = prune(nodeShare, edgeShare);
    if (state.selected !== null && !state.vis.nodes.some((n) => n.id === state.selected)) {
      state.selected = null;
      state.pinned = null;
    }
    const scored = DATA.n_nodes_scored ? ` of ${DATA.n_nodes_scored} scored nodes` : "";
    const note = DATA.edges_pruned_in_json ? " (this graph.json holds its pruned edges only)" : "";
    document.getElementById("counts").textContent =
      `showing ${state.vis.nodes.length - 1} of ${inner.length} nodes and the logit ` +
      `(${fmt(100 * state.vis.nodeCover)}% of the |score|${scored}), ` +
      `${state.vis.edges.length} of ${state.vis.edgesAmong} edges among them${note}`;
    draw();
    showPinned();
  }

  function legend() {
    const items = [];
    const kinds = [...new Set(nodes.map((n) => n.kind))];
    for (const kind of kinds) {
      const s = svgEl("svg", { width: 14, height: 14 });
      s.append(svgEl("circle", { cx: 7, cy: 7, r: 6, fill: DATA.colours[kind] }));
      items.push(el("span", { className: "item" }, [s, " " + kind]));
    }
    if (nodes.some((n) => n.bridge)) {
      const s = svgEl("svg", { width: 14, height: 14 });
      s.append(svgEl("circle", { cx: 7, cy: 7, r: 5, fill: "#fff", stroke: "#555",
        "stroke-width": 2, "stroke-dasharray": "3 2" }));
      items.push(el("span", { className: "item" }, [s, " bridge (an SAE's paths across)"]));
    }
    for (const [colour, text] of [[POS, "helps the answer (+)"], [NEG, "hurts it (−)"]]) {
      const s = svgEl("svg", { width: 30, height: 14 });
      s.append(svgEl("line", { x1: 1, y1: 7, x2: 29, y2: 7, stroke: colour, "stroke-width": 3 }));
      s.append(svgEl("circle", { cx: 15, cy: 7, r: 5, fill: "#fff", stroke: colour,
        "stroke-width": 2.5 }));
      items.push(el("span", { className: "item" }, [s, " " + text]));
    }
    items.push(el("span", { className: "item", textContent: "node size grows with |score|, edge " +
      `width with |weight| (largest ${fmt(wMax)})` }));
    document.getElementById("legend").replaceChildren(...items);
  }

  nodeInput.max = String(covered);
  nodeInput.value = String(Math.min(DATA.node_threshold, covered));
  edgeInput.value = String(DATA.edge_threshold);
  nodeInput.addEventListener("input", update);
  edgeInput.addEventListener("input", update);
  svg.addEventListener("click", clearSelection);
  window.addEventListener("resize", update);
  document.addEventListener("keydown", (ev) => ev.key === "Escape" && clearSelection());
  legend();
  update();
})();
