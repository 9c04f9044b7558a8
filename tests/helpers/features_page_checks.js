// Injected after the feature browser's own script by tests/helpers/graph_page.py (with_checks).
// Reads the card the page's address opened, sorts and searches as a reader would, clicks a row
// and follows an anchor into another dictionary's page, and leaves the findings as JSON in
// <body data-checks>. The test's settings replace CONFIG: {sorts: [[key, descending]],
// header: key, searches: [[mode, query]], click: feature, follow: anchor}.
(function () {
  const config = CONFIG;
  const byId = (id) => document.getElementById(id);

  const rows = () => [...document.querySelectorAll("#features tbody tr")].map(
    (tr) => +tr.dataset.feature);

  // The alpha of a computed background colour: rgba(r, g, b, a), or rgb(r, g, b) for 1.
  function alpha(colour) {
    const parts = colour.match(/[\d.]+/g).map(Number);
    return parts.length === 4 ? parts[3] : 1;
  }

  function card() {
    const c = byId("card");
    return {
      hidden: c.hidden,
      anchor: c.dataset.anchor,
      feature: c.dataset.feature === undefined ? null : +c.dataset.feature,
      label: c.querySelector(".label") ? c.querySelector(".label").textContent : null,
      text: c.textContent,
      hist: [...c.querySelectorAll(".act-hist .bar")].map(
        (b) => [+b.dataset.bin, +b.dataset.count, +b.getAttribute("height")]),
      contexts: [...c.querySelectorAll("li.context")].map((li) => {
        const toks = [...li.querySelectorAll(".tok")];
        return {
          band: +li.dataset.band,
          activation: +li.dataset.activation,
          peak: toks.findIndex((s) => s.classList.contains("peak")),
          tokens: toks.map((s) => s.textContent),
          values: toks.map((s) => +s.dataset.v),
          alphas: toks.map((s) => alpha(getComputedStyle(s).backgroundColor)),
        };
      }),
      logits: [...c.querySelectorAll("table.logits tr")].slice(1).map(
        (tr) => [...tr.children].map((td) => td.textContent)),
    };
  }

  function set(id, value, event) {
    const input = byId(id);
    if (input.type === "checkbox") input.checked = value;
    else input.value = String(value);
    input.dispatchEvent(new Event(event));
  }

  // Resolves once the page has handled the address change (or after a second: then the
  // findings show the card unchanged).
  function hashChanged(action) {
    return new Promise((resolve) => {
      window.addEventListener("hashchange", () => setTimeout(resolve, 0), { once: true });
      setTimeout(resolve, 1000);
      action();
    });
  }

  async function run() {
    const out = { errors: window.__errors };
    out.opened = card();
    out.initial = rows();
    out.counts = byId("counts").textContent;
    out.sorted = (config.sorts || []).map(([key, descending]) => {
      set("sort", key, "change");
      set("descending", descending, "change");
      return rows();
    });
    if (config.header) {
      set("sort", "feature", "change");
      set("descending", false, "change");
      document.querySelector(`#features th[data-sort="${config.header}"]`).click();
      out.header = { sort: byId("sort").value, descending: byId("descending").checked,
                     rows: rows() };
    }
    set("sort", "feature", "change");
    set("descending", false, "change");
    out.searches = (config.searches || []).map(([mode, query]) => {
      set("search-mode", mode, "change");
      set("search", query, "input");
      return rows();
    });
    set("search", "", "input");
    set("search-mode", "any", "change");
    if (config.click !== undefined) {
      const row = document.querySelector(`#features tbody tr[data-feature="${config.click}"]`);
      await hashChanged(() => row.click());
      out.clicked = { hash: location.hash, card: card(),
                      selected: rows().filter((f, k) =>
                        document.querySelectorAll("#features tbody tr")[k]
                          .classList.contains("selected")) };
    }
    if (config.follow) {
      await hashChanged(() => { location.hash = config.follow; });
      const link = byId("card").querySelector("a.elsewhere");
      out.followed = { hash: location.hash, card: card(), rows: rows().length,
                       elsewhere: link ? link.getAttribute("href") : null };
    }
    document.body.setAttribute("data-checks", JSON.stringify(out));
  }

  window.addEventListener("load", () => {
    run().catch((e) => {
      window.__errors.push("checks: " + e);
      document.body.setAttribute("data-checks", JSON.stringify({ errors: window.__errors }));
    });
  });
})();
