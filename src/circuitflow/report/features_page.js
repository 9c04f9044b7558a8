// A dictionary's page of the feature browser (report/features_page.py writes the page and its
// data): a table of the dictionary's features, sorted and filtered in the page, and a feature's
// card. The address `#site.layer.fINDEX` (Node.anchor in circuitflow/nodes.py) opens a card;
// clicking a row sets it, so the back button and links work. Another dictionary's address goes
// to the browser's index (report/features.html), which sends it on to that dictionary's page.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("feature-data").textContent);
  const vocab = data.vocab;
  const d = data.dictionary;
  const PAGE = 200; // rows drawn at a time; "show more" draws the next ones
  const SHADE = [255, 127, 14]; // a token's background, its alpha the activation / the maximum
  const SORTS = { feature: "feature", f1: "f1", density: "density", max: "max", mean: "mean" };
  const COLUMNS = [
    ["feature", "feature"], ["label", null], ["label F1", "f1"], ["density", "density"],
    ["max activation", "max"], ["mean activation", "mean"],
  ];
  const state = { sort: "feature", descending: false, mode: "any", query: "", shown: PAGE,
                  open: null };
  const byId = (id) => document.getElementById(id);
  const table = byId("features"), card = byId("card");

  function make(tag, attrs, text) {
    const node = tag.startsWith("svg:")
      ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // 3 significant digits, as report/tables and the graph pages round for people.
  function fmt(x) {
    if (x === null || x === undefined) return "n/a";
    if (!isFinite(x)) return String(x);
    return String(Number(x.toPrecision(3)));
  }
  const percent = (x) => (x === null || x === undefined ? "n/a" : fmt(100 * x) + "%");
  const shown = (token) => token.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
  const tokenKey = (token) => token.trim().toLowerCase();
  const anchor = (d, i) => `${d.key}.f${d.features.feature[i]}`;

  // Per dictionary, once: each feature's searchable tokens (the tokens it fires on in its top
  // contexts and the ones it promotes) and where each feature index sits in the arrays.
  function index(d) {
    if (d._tokens) return;
    d._tokens = d.features.contexts.map((contexts, i) => {
      const set = new Set();
      for (const [band, , peak, tokens] of contexts) {
        if (band < 0) set.add(tokenKey(vocab[tokens[peak]]));
      }
      for (const [id] of d.features.promoted[i]) set.add(tokenKey(vocab[id]));
      return set;
    });
    d._position = new Map(d.features.feature.map((f, i) => [f, i]));
  }

  function matches(d, i) {
    const q = state.query.trim();
    if (!q) return true;
    const f = d.features;
    const number = /^f?(\d+)$/i.exec(q);
    const byIndex = number !== null && f.feature[i] === +number[1];
    const byLabel = f.label[i].toLowerCase().includes(q.toLowerCase());
    const byToken = d._tokens[i].has(tokenKey(q));
    return { index: byIndex, label: byLabel, token: byToken }[state.mode] ??
      (byIndex || byLabel || byToken);
  }

  // The matching features in the chosen order; ties (dead features, equal densities) by index;
  // a missing value (an unscored label's F1) sorts below every number.
  function order(d) {
    const f = d.features, key = f[SORTS[state.sort]], sign = state.descending ? -1 : 1;
    const value = (i) => (key[i] === null ? -1 : key[i]);
    const rows = [];
    for (let i = 0; i < f.feature.length; i++) if (matches(d, i)) rows.push(i);
    return rows.sort((a, b) => sign * (value(a) - value(b)) || f.feature[a] - f.feature[b]);
  }

  function histogramSvg(bars, width, height, cls) {
    // bars: [[label, value, title]]; one column each, heights relative to the largest.
    const w = Math.min(16, width / Math.max(1, bars.length)); // a few bins stay narrow
    const svg = make("svg:svg", { width: Math.max(w * bars.length, 40), height, class: cls });
    const top = Math.max(1, ...bars.map((b) => b[1]));
    bars.forEach(([label, value, title], k) => {
      const h = value > 0 ? Math.max(1, ((height - 14) * value) / top) : 0;
      const rect = make("svg:rect", { x: k * w + 0.5, y: height - 14 - h, width: Math.max(1, w - 1),
                                      height: h, class: "bar", "data-bin": label,
                                      "data-count": value });
      rect.append(make("svg:title", {}, title));
      svg.append(rect);
    });
    return svg;
  }

  // summary.json's `labels`: each labeller's held-out mean F1, share at F1 >= 0.8, control.
  function labelsLine(s) {
    const L = s.labels;
    if (!L) return `labels: ${s.labeller}`;
    const each = Object.entries(L.labellers).map(([name, b]) =>
      `${name}${name === L.shown ? " (shown)" : ""} mean F1 ${fmt(b.mean_f1)}, ` +
      `${percent(b["share_f1_at_least_0.8"])} at F1 \u2265 ${L.strong_f1}, ` +
      `control ${fmt(b.control.mean_f1)}`);
    return `labels scored on ${L.held_out_tokens} held-out tokens: ${each.join("; ")}`;
  }

  function drawSummary() {
    const s = d.summary;
    const lines = [
      `${s.n_features} features read over ${s.n_tokens} tokens (${s.n_contexts} contexts of ` +
        `${s.context_length}, from position ${s.first_position}); dead ${s.n_dead} ` +
        `(${percent(s.dead_fraction)}), dense ${s.n_dense} (${percent(s.dense_fraction)}, ` +
        `density above ${fmt(s.dense_threshold)})`,
      labelsLine(s),
      `logit effects: ${s.final_norm}`,
    ];
    const meta = Object.entries(d.meta).map(([k, v]) => `${k}: ${v}`).join("; ");
    if (meta) lines.push(meta);
    const box = byId("summary");
    const back = make("p", { class: "meta" });
    back.append(make("a", { href: data.index, id: "index" }, "\u2190 every dictionary"));
    box.replaceChildren(back, make("h2", {}, `${d.site} layer ${d.layer}`),
                        ...lines.map((l) => make("p", { class: "meta" }, l)));
    const edges = s.log_density_edges || [], counts = s.log_density_hist || [];
    if (counts.length) {
      const bars = counts.map((c, k) => [k, c, `log10 density ${fmt(edges[k])} to ` +
                                         `${fmt(edges[k + 1])}: ${c} features`]);
      const fig = make("div", { class: "figure" });
      fig.append(make("span", { class: "caption" },
                      `log10 density of the live features, ${fmt(edges[0])} to ` +
                      `${fmt(edges[edges.length - 1])}`),
                 histogramSvg(bars, 320, 60, "density-hist"));
      box.append(fig);
    }
  }

  function drawTable() {
    const f = d.features;
    index(d);
    const head = make("tr");
    for (const [name, key] of COLUMNS) {
      const th = make("th", key ? { "data-sort": key } : {}, name);
      if (key === state.sort) th.classList.add(state.descending ? "desc" : "asc");
      if (key) th.addEventListener("click", () => {
        state.descending = key === state.sort ? !state.descending : key !== "feature";
        state.sort = key;
        syncControls();
        drawTable();
      });
      head.append(th);
    }
    table.tHead.replaceChildren(head);
    const rows = order(d);
    const body = rows.slice(0, state.shown).map((i) => {
      const tr = make("tr", { "data-feature": f.feature[i] });
      if (f.dead[i]) tr.classList.add("dead");
      if (f.dense[i]) tr.classList.add("dense");
      if (state.open === anchor(d, i)) tr.classList.add("selected");
      tr.append(make("td", { class: "num" }, String(f.feature[i])), make("td", {}, f.label[i]),
                make("td", { class: "num" }, fmt(f.f1[i])),
                make("td", { class: "num" }, fmt(f.density[i])),
                make("td", { class: "num" }, fmt(f.max[i])),
                make("td", { class: "num" }, fmt(f.mean[i])));
      tr.addEventListener("click", () => go(anchor(d, i)));
      return tr;
    });
    table.tBodies[0].replaceChildren(...body);
    byId("more").hidden = rows.length <= state.shown;
    byId("counts").textContent =
      `showing ${body.length} of ${rows.length} matching (${f.feature.length} features)`;
  }

  function syncControls() {
    byId("sort").value = state.sort;
    byId("descending").checked = state.descending;
  }

  function go(target) {
    if (location.hash === "#" + target) fromHash();
    else location.hash = target;
  }

  // --- the card ----------------------------------------------------------------------------
  function tokenSpan(id, value, max, peak) {
    const alpha = max > 0 ? Math.min(1, Math.max(0, value / max)) : 0;
    const span = make("span", { class: peak ? "tok peak" : "tok", "data-v": value,
                                title: `activation ${fmt(value)}` }, shown(vocab[id]));
    span.style.backgroundColor = `rgba(${SHADE.join(", ")}, ${alpha.toFixed(3)})`;
    return span;
  }

  function contextItem([band, activation, peak, tokens, values], max) {
    const li = make("li", { class: "context", "data-band": band, "data-activation": activation });
    li.append(make("span", { class: "act" }, fmt(activation)));
    const text = make("span", { class: "window" });
    tokens.forEach((id, k) => text.append(tokenSpan(id, values[k], max, k === peak)));
    li.append(text);
    return li;
  }

  function activationHistogram(d, i) {
    const hist = d.features.hist[i], edges = d.hist_edges;
    if (!hist.length) return make("p", { class: "none" }, "no positive activation");
    const counts = new Map(hist);
    const first = hist[0][0], last = hist[hist.length - 1][0];
    const bars = [];
    for (let b = first; b <= last; b++) {
      const n = counts.get(b) || 0;
      bars.push([b, n, `[${fmt(edges[b])}, ${fmt(edges[b + 1])}): ${n} tokens`]);
    }
    const fig = make("div", { class: "figure" });
    fig.append(histogramSvg(bars, 420, 90, "act-hist"),
               make("span", { class: "axis" },
                    `activation ${fmt(edges[first])} to ${fmt(edges[last + 1])}, ` +
                    "log-spaced bins (tokens per bin)"));
    return fig;
  }

  function logitTable(d, i) {
    const up = d.features.promoted[i], down = d.features.suppressed[i];
    const t = make("table", { class: "logits" });
    const head = make("tr");
    head.append(make("th", { colspan: 2 }, "promoted"), make("th", { colspan: 2 }, "suppressed"));
    t.append(head);
    for (let k = 0; k < Math.max(up.length, down.length); k++) {
      const tr = make("tr");
      for (const [rows, cls] of [[up, "up"], [down, "down"]]) {
        const row = rows[k];
        tr.append(make("td", { class: "tok-cell " + cls }, row ? shown(vocab[row[0]]) : ""),
                  make("td", { class: "num " + cls }, row ? (row[1] > 0 ? "+" : "") + fmt(row[1])
                                                          : ""));
      }
      t.append(tr);
    }
    return t;
  }

  // How far to trust the label: its held-out F1 and the counts behind it, beside the control.
  function scoreLine(d, i) {
    const f = d.features, s = d.summary, L = s.labels || {};
    if (f.dead[i]) return "dead: no label to score";
    if (f.f1[i] === null) return "label unscored (a folder written before labels were scored)";
    const predicted = f.tp[i] + f.fp[i], firing = f.tp[i] + f.fn[i];
    return `label (${s.labeller}) F1 ${fmt(f.f1[i])} on ${L.held_out_tokens} held-out tokens: ` +
      `precision ${fmt(f.precision[i])} (fires on ${f.tp[i]} of the ${predicted} tokens the ` +
      `label names), recall ${fmt(f.recall[i])} (the label names ${f.tp[i]} of the ${firing} ` +
      `tokens it fires on); control (another feature's label) F1 ${fmt(f.control_f1[i])}`;
  }

  function drawCard(d, i) {
    const f = d.features, s = d.summary, max = f.max[i];
    const target = anchor(d, i);
    card.hidden = false;
    card.dataset.anchor = target;
    card.dataset.feature = f.feature[i];
    const title = make("h2", {}, `${d.site} layer ${d.layer} \u00b7 feature ${f.feature[i]} `);
    title.append(make("a", { href: "#" + target, class: "link" }, "#" + target));
    const flags = [f.dead[i] ? "dead" : "", f.dense[i] ? "dense" : ""].filter(Boolean);
    if (d.neuronpedia) {
      title.append(" ", make("a", { href: d.neuronpedia + f.feature[i], class: "neuronpedia",
                                    target: "_blank" }, "Neuronpedia"));
    }
    const parts = [
      title,
      make("p", { class: "label" }, f.label[i]),
      make("p", { class: "score" }, scoreLine(d, i)),
      make("p", { class: "stats" },
           `density ${fmt(f.density[i])} (${f.count[i]} of ${s.n_tokens} tokens) \u00b7 ` +
           `max activation ${fmt(max)} \u00b7 mean activation ${fmt(f.mean[i])}` +
           (flags.length ? ` \u00b7 ${flags.join(", ")}` : "")),
      make("h3", {}, "activation histogram"),
      activationHistogram(d, i),
      make("h3", {}, "logit effects of its decoder direction (per unit activation)"),
      logitTable(d, i),
    ];
    const contexts = f.contexts[i];
    const top = contexts.filter((c) => c[0] < 0);
    parts.push(make("h3", {}, "top activations"));
    if (top.length) {
      const ol = make("ol", { class: "contexts top" });
      ol.append(...top.map((c) => contextItem(c, max)));
      parts.push(ol);
    } else {
      parts.push(make("p", { class: "none" }, "never fired on the tokens read"));
    }
    const bands = [...new Set(contexts.filter((c) => c[0] >= 0).map((c) => c[0]))];
    if (bands.length) parts.push(make("h3", {}, "sampled by activation quantile"));
    for (const band of bands.sort((a, b) => b - a)) {
      const [lo, hi, share] = f.bands[i][band];
      parts.push(make("p", { class: "band" },
                      `band ${band}: activation ${fmt(lo)} to ${fmt(hi)}, ` +
                      `${percent(share)} of the tokens it fires on`));
      const ol = make("ol", { class: "contexts quantile", "data-band": band });
      ol.append(...contexts.filter((c) => c[0] === band).map((c) => contextItem(c, max)));
      parts.push(ol);
    }
    card.replaceChildren(...parts);
  }

  // --- navigation --------------------------------------------------------------------------
  // Another dictionary's feature: its page is not this one; the index knows where it is.
  function elsewhere(target) {
    card.hidden = false;
    delete card.dataset.feature;
    card.dataset.anchor = target;
    const p = make("p", { class: "none" }, `${target} is not on this page (${d.key}): `);
    p.append(make("a", { href: `${data.index}#${target}`, class: "elsewhere" },
                  "find it from the index"));
    card.replaceChildren(p);
  }

  function fromHash() {
    let target = location.hash.slice(1);
    try {
      target = decodeURIComponent(target);
    } catch (e) { /* a malformed escape: match the address as it is */ }
    if (!target) return;
    const m = /^(.*)\.f(\d+)$/.exec(target);
    if ((m ? m[1] : target) !== d.key) return elsewhere(target);
    index(d);
    const i = m ? d._position.get(+m[2]) : undefined;
    state.open = i === undefined ? null : target;
    if (i === undefined) card.hidden = true;
    else drawCard(d, i);
    drawTable();
    const row = table.querySelector("tr.selected");
    if (row) row.scrollIntoView({ block: "nearest" });
    // Narrow (the graph pages' panel), the card sits above the table: bring it into view.
    if (!card.hidden) card.scrollIntoView({ block: "nearest" });
  }

  function init() {
    byId("search").addEventListener("input", (e) => {
      state.query = e.target.value;
      state.shown = PAGE;
      drawTable();
    });
    byId("search-mode").addEventListener("change", (e) => {
      state.mode = e.target.value;
      drawTable();
    });
    byId("sort").addEventListener("change", (e) => {
      state.sort = e.target.value;
      drawTable();
    });
    byId("descending").addEventListener("change", (e) => {
      state.descending = e.target.checked;
      drawTable();
    });
    byId("more").addEventListener("click", () => {
      state.shown += PAGE;
      drawTable();
    });
    window.addEventListener("hashchange", fromHash);
    drawSummary();
    drawTable();
    fromHash();
  }

  init();
})();
