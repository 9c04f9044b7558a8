// Injected after graph.html's own script by tests/helpers/graph_page.py. Reads what the page
// drew from the DOM, hovers and clicks nodes and moves the thresholds as a reader would, and
// leaves the findings as JSON in <body data-checks>. The test's settings replace CONFIG:
// {hover, click, click_text, edge_share, node_share, pose}.
(function () {
  const config = CONFIG;
  const svg = document.getElementById("graph");

  // Points at most a pixel apart along a rendered path's `d` (absolute M, L, H, V and C, what
  // the page writes; any other command is an error, so nothing goes unchecked).
  function samplePath(d) {
    const tokens = d.match(/[A-Za-z]|-?[\d.]+(?:e-?\d+)?/g);
    const pts = [];
    let i = 0, x = 0, y = 0;
    const num = () => +tokens[i++];
    const line = (x1, y1) => {
      const n = Math.max(1, Math.ceil(Math.hypot(x1 - x, y1 - y)));
      for (let k = 1; k <= n; k++) pts.push([x + ((x1 - x) * k) / n, y + ((y1 - y) * k) / n]);
      [x, y] = [x1, y1];
    };
    while (i < tokens.length) {
      const cmd = tokens[i++];
      if (cmd === "M") {
        [x, y] = [num(), num()];
        pts.push([x, y]);
      } else if (cmd === "L") line(num(), num());
      else if (cmd === "H") line(num(), y);
      else if (cmd === "V") line(x, num());
      else if (cmd === "C") {
        const [x1, y1, x2, y2, x3, y3] = [num(), num(), num(), num(), num(), num()];
        const hull = Math.hypot(x1 - x, y1 - y) + Math.hypot(x2 - x1, y2 - y1) +
          Math.hypot(x3 - x2, y3 - y2); // bounds the curve's length
        const n = Math.max(1, Math.ceil(hull));
        for (let k = 1; k <= n; k++) {
          const t = k / n, u = 1 - t;
          const a = u * u * u, b = 3 * u * u * t, c = 3 * u * t * t, e = t * t * t;
          pts.push([a * x + b * x1 + c * x2 + e * x3, a * y + b * y1 + c * y2 + e * y3]);
        }
        [x, y] = [x3, y3];
      } else throw new Error("unexpected path command " + cmd + " in " + d);
    }
    return pts;
  }

  // Every edge as drawn, sampled every pixel; a sample closer to a node disk the edge does not
  // connect than that disk's radius plus half the stroke is a crossing. Labels too: a sample
  // within half a stroke of a label's box is an edge drawn over a label.
  function geometry() {
    const circles = [...svg.querySelectorAll(".node")].map((g) => {
      const c = g.querySelector("circle");
      return { id: g.dataset.id, x: +c.getAttribute("cx"), y: +c.getAttribute("cy"),
               r: +c.getAttribute("r"), label: g.querySelector("text").getBBox() };
    });
    const crossings = new Set(), overLabels = new Set();
    let samples = 0;
    for (const p of svg.querySelectorAll(".edge")) {
      const ends = [p.dataset.source, p.dataset.target];
      const half = +p.getAttribute("stroke-width") / 2;
      for (const [x, y] of samplePath(p.getAttribute("d"))) {
        samples += 1;
        for (const c of circles) {
          const b = c.label;
          if (x >= b.x - half && x <= b.x + b.width + half &&
              y >= b.y - half && y <= b.y + b.height + half) {
            overLabels.add(JSON.stringify([ends.join("->"), c.id]));
          }
          if (!ends.includes(c.id) && Math.hypot(x - c.x, y - c.y) < c.r + half) {
            crossings.add(JSON.stringify([ends.join("->"), c.id]));
          }
        }
      }
    }
    return { crossings: [...crossings], over_labels: [...overLabels], samples: samples,
             n_circles: circles.length };
  }

  function visible() {
    return {
      nodes: [...svg.querySelectorAll(".node")].map((g) => g.dataset.id),
      edges: [...svg.querySelectorAll(".edge")].map((p) => [p.dataset.source, p.dataset.target]),
    };
  }

  // Each drawn feature: the text above it and where its card is (the feature browser).
  function features() {
    return [...svg.querySelectorAll(".node")].filter((g) => g.dataset.id.startsWith("feature."))
      .map((g) => ({ id: g.dataset.id, text: g.querySelector("text").textContent,
                     href: g.dataset.card || null }));
  }

  // The panel a click on a feature opens: shown or not, the card its frame loads, its link.
  function panel() {
    const p = document.getElementById("feature-panel");
    if (!p) return null;
    return { hidden: p.hidden, src: p.querySelector("iframe").getAttribute("src"),
             tab: p.querySelector("a.browser").getAttribute("href"),
             title: p.querySelector(".title").textContent };
  }

  // The open card's label line and its link to the feature browser.
  function cardLabel(card) {
    const label = card.querySelector(".feature-label"), a = card.querySelector("a.browser");
    return { label: label ? label.textContent : null, link: a ? a.getAttribute("href") : null };
  }

  function node(id) {
    return svg.querySelector(`.node[data-id="${CSS.escape(id)}"]`);
  }

  function slide(id, value) {
    const input = document.getElementById(id);
    input.value = String(value);
    input.dispatchEvent(new Event("input"));
  }

  // For a screenshot: the page as a reader leaves it after clicking and hovering.
  function pose() {
    if (config.click) node(config.click).dispatchEvent(new MouseEvent("click", { bubbles: true }));
    if (config.hover) node(config.hover).dispatchEvent(new MouseEvent("mouseenter"));
  }

  function run() {
    if (config.pose) return pose();
    const out = { errors: window.__errors };
    out.initial = visible();
    // Each drawn edge's hover text (its <title>): the weight and where it comes from.
    out.edge_titles = [...svg.querySelectorAll(".edge")].map((p) =>
      [p.dataset.source, p.dataset.target, p.querySelector("title").textContent]);
    out.initial_geometry = geometry();
    out.svg_size = [+svg.getAttribute("width"), +svg.getAttribute("height")];
    out.features = features();
    const card = document.getElementById("card");
    if (config.hover) {
      node(config.hover).dispatchEvent(new MouseEvent("mouseenter"));
      out.hover = { hidden: card.hidden, node: card.dataset.node, text: card.textContent,
                    marks: [...card.querySelectorAll("mark")].map((m) => m.textContent),
                    contexts: card.querySelectorAll("li").length, ...cardLabel(card) };
      node(config.hover).dispatchEvent(new MouseEvent("mouseleave"));
      out.hover_after_leave_hidden = card.hidden;
    }
    if (config.click) {
      node(config.click).dispatchEvent(new MouseEvent("click", { bubbles: true }));
      out.click = {
        nodes_on: [...svg.querySelectorAll(".node.on")].map((g) => g.dataset.id),
        edges_on: [...svg.querySelectorAll(".edge.on")].map((p) =>
          [p.dataset.source, p.dataset.target]),
        card_node: card.dataset.node,
        panel: panel(),
      };
      svg.dispatchEvent(new MouseEvent("click", { bubbles: true }));
      out.cleared = svg.querySelectorAll(".edge.on, .node.on").length === 0 && card.hidden;
      out.panel_after_clear = panel();
    }
    if (config.click_text) {
      // A click where a feature's text is drawn (not its disk), on whatever the page's hit
      // testing finds there: the same as a click on the node.
      const text = node(config.click_text).querySelector("text");
      text.scrollIntoView({ block: "center", inline: "center" });
      const box = text.getBoundingClientRect();
      const hit = document.elementFromPoint(box.x + box.width / 2, box.y + box.height / 2);
      hit.dispatchEvent(new MouseEvent("click", { bubbles: true }));
      out.click_text = { hit_text: hit === text, card_node: card.dataset.node,
        selected: [...svg.querySelectorAll(".node.selected")].map((g) => g.dataset.id),
        panel: panel() };
      svg.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    }
    slide("edge-threshold", config.edge_share);
    out.after_edge_threshold = visible();
    out.after_edge_geometry = geometry();
    slide("node-threshold", config.node_share);
    out.after_node_threshold = visible();
    out.after_node_geometry = geometry();
    out.counts = document.getElementById("counts").textContent;
    document.body.setAttribute("data-checks", JSON.stringify(out));
  }

  window.addEventListener("load", () => {
    try {
      run();
    } catch (e) {
      window.__errors.push("checks: " + e);
      document.body.setAttribute("data-checks", JSON.stringify({ errors: window.__errors }));
    }
  });
})();
