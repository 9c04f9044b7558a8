/* The feature browser seen from a graph page: graph.html and prompt_graphs.html (page.py and
   prompt_graphs/page.py inline this before their own script) open a clicked feature's card
   from the report's feature browser in a panel beside the graph. Plain JavaScript; the panel's
   frame loads the dictionary's page (report/features/{site}/layer_{layer}.html) from disk. */
// eslint-disable-next-line no-unused-vars
function featureBrowser(href) {
  "use strict";
  // `href`: the browser's folder seen from this page (page.browser_href), or null in a run
  // without one. A page can follow it only from the results folder: the Snakemake report
  // embeds each page on its own (a data: address), where nothing beside it can be reached.
  const root = href && ["file:", "http:", "https:"].includes(location.protocol) ? href : null;
  const panel = document.createElement("aside");
  panel.id = "feature-panel";
  panel.hidden = true;
  const bar = document.createElement("div");
  bar.className = "bar";
  const title = document.createElement("span");
  title.className = "title";
  const tab = document.createElement("a");
  tab.className = "browser";
  tab.target = "_blank";
  tab.textContent = "open in a new tab";
  // A published dictionary's feature: its page on Neuronpedia (the node's `neuronpedia`).
  const np = document.createElement("a");
  np.className = "neuronpedia";
  np.target = "_blank";
  np.textContent = "Neuronpedia";
  const close = document.createElement("button");
  close.type = "button";
  close.title = "close (Escape)";
  close.textContent = "\u00d7";
  bar.append(title, tab, np, close);
  const frame = document.createElement("iframe");
  frame.title = "the feature's card in the feature browser";
  panel.append(bar, frame);
  document.body.append(panel);

  // A feature node's card (its data's `card`: Node.card, relative to the browser's index).
  const cardHref = (n) => (root && n.card ? root + n.card : null);

  function hide() {
    panel.hidden = true;
    document.body.classList.remove("feature-panel-open");
    delete panel.dataset.card;
  }

  // Open `n`'s card (a feature node) under `heading`; false where there is no browser to open.
  function open(n, heading) {
    const target = cardHref(n);
    if (!target) return false;
    if (frame.getAttribute("src") !== target) frame.setAttribute("src", target);
    title.textContent = heading;
    tab.setAttribute("href", target);
    np.hidden = !n.neuronpedia;
    if (n.neuronpedia) np.setAttribute("href", n.neuronpedia);
    panel.dataset.card = target;
    panel.hidden = false;
    document.body.classList.add("feature-panel-open");
    return true;
  }

  close.addEventListener("click", (ev) => {
    ev.stopPropagation();
    hide();
  });
  // Where the page's own room ends on the right: the panel's left edge while it is open.
  const edge = () => (panel.hidden ? window.innerWidth : panel.getBoundingClientRect().left);
  return { available: root !== null, href: cardHref, open: open, close: hide, edge: edge };
}
