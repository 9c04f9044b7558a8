// Injected after prompt_graphs.html's own script by tests/helpers/graph_page.py. Reads
// what the page drew from the DOM, hovers a feature and an edge carried by heads, moves the
// thresholds and switches prompts as a reader would, and leaves the findings as JSON in
// <body data-checks>. The test's settings replace CONFIG: {node_low, node_high}.
(function () {
  const config = CONFIG;
  const svg = document.getElementById("graph");
  const card = document.getElementById("card");

  // Every drawn node: kind, position, row, centre; every token label: position, text, x.
  function drawn() {
    const labels = [...svg.querySelectorAll("text.token-label")].map((t) => ({
      pos: +t.dataset.pos, text: t.textContent, x: +t.getAttribute("x"),
      y: +t.getAttribute("y") }));
    const bands = [...svg.querySelectorAll("rect.band")].map((b) => ({
      y: +b.getAttribute("y"), h: +b.getAttribute("height") }));
    const nodes = [...svg.querySelectorAll("g.node")].map((g) => {
      const box = g.firstElementChild.getBBox();
      return { kind: g.dataset.kind, pos: +g.dataset.pos, row: +g.dataset.row,
               x: box.x + box.width / 2, y: box.y + box.height / 2, w: box.width };
    });
    return { labels: labels, bands: bands, nodes: nodes,
             edges: svg.querySelectorAll("path.edge").length,
             counts: document.getElementById("counts").textContent };
  }

  function setThreshold(id, value) {
    const input = document.getElementById(id);
    input.value = value;
    input.dispatchEvent(new Event("input"));
  }

  function hover(target) {
    target.dispatchEvent(new MouseEvent("mousemove", { clientX: 100, clientY: 100 }));
    const label = card.querySelector(".feature-label");
    const seen = { hidden: card.hidden, text: card.textContent,
                   title: card.querySelector("h3").textContent,
                   label: label ? label.textContent : null,
                   items: card.querySelectorAll("li").length,
                   heads: [...card.querySelectorAll("li.head")].map((li) => li.textContent) };
    target.dispatchEvent(new MouseEvent("mouseleave"));
    seen.hidden_after = card.hidden;
    return seen;
  }

  window.addEventListener("load", () => {
    try {
      const graphs = JSON.parse(document.getElementById("graph-data").textContent).graphs;
      const out = { errors: window.__errors, tokens_json: graphs.map((g) => g.tokens),
                    slug: graphs[+document.getElementById("prompt").value].slug };
      out.default = drawn();
      out.scores = document.getElementById("scores").textContent;
      const feature = svg.querySelector("g.node.feature");
      out.feature_card = feature ? hover(feature) : null;
      // Every drawn feature: its card's title and label, where its card is in the feature
      // browser, and what a click on it opened in the panel beside the graph.
      const panel = () => document.getElementById("feature-panel");
      out.features = [...svg.querySelectorAll("g.node.feature")].map((g) => {
        const seen = Object.assign(hover(g), { href: g.dataset.card || null });
        g.dispatchEvent(new MouseEvent("click", { bubbles: true }));
        const frame = panel().querySelector("iframe");
        seen.panel = { hidden: panel().hidden, src: frame.getAttribute("src"),
                       tab: panel().querySelector("a.browser").getAttribute("href") };
        document.dispatchEvent(new KeyboardEvent("keydown", { key: "Escape" }));
        seen.panel_hidden_after_escape = panel().hidden;
        return seen;
      });
      const carried = [...svg.querySelectorAll("path.edge")].find((p) => +p.dataset.heads > 0);
      out.edge_card = carried ? hover(carried) : null;
      setThreshold("node-threshold", config.node_low);
      out.low = drawn();
      setThreshold("node-threshold", config.node_high);
      out.high = drawn();
      const select = document.getElementById("prompt");
      out.n_prompts = select.options.length;
      select.value = String(select.options.length - 1);
      select.dispatchEvent(new Event("change"));
      out.last_prompt = drawn();
      document.body.setAttribute("data-checks", JSON.stringify(out));
    } catch (e) {
      window.__errors.push("checks: " + e);
      document.body.setAttribute("data-checks", JSON.stringify({ errors: window.__errors }));
    }
  });
})();
