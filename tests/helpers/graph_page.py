"""graph.html in headless Chromium: the checks of graph_page_checks.js (layout geometry, hover
card, path highlighting, thresholds, JavaScript errors) and screenshots."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from helpers.chromium import browse

CHECKS_JS = (Path(__file__).parent / "graph_page_checks.js").read_text()
PROMPT_CHECKS_JS = (Path(__file__).parent / "prompt_graph_page_checks.js").read_text()
# Before the page's own script: every uncaught error and console.error is recorded.
HEAD_JS = (
    "<script>window.__errors=[];"
    "window.addEventListener('error',e=>window.__errors.push(String(e.message)));"
    "const __error=console.error;"
    "console.error=(...a)=>{window.__errors.push(a.map(String).join(' '));__error(...a)};</script>"
)


def with_checks(page: Path, out: Path, checks_js: str = CHECKS_JS, **config) -> Path:
    text = page.read_text()
    assert text.count("<head>") == 1 and "</body>" in text
    text = text.replace("<head>", "<head>" + HEAD_JS, 1)
    end = text.rindex("</body>")
    script = "<script>" + checks_js.replace("CONFIG", json.dumps(config)) + "</script>"
    out.write_text(text[:end] + script + text[end:])
    return out


def check_page(
    browser: str, page: Path, tmp: Path, checks_js: str = CHECKS_JS, fragment: str = "", **config
) -> dict:
    """The findings of `checks_js` (graph_page_checks.js) on `page` (see CONFIG there), opened
    at `#fragment` when given."""
    checked = with_checks(page, tmp / f"checks_{page.name}", checks_js, **config)
    done = browse(browser, checked, "--dump-dom", fragment=fragment)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'data-checks="([^"]*)"', done.stdout)
    assert found, "the checks did not run: " + done.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))


def screenshot(browser: str, page: Path, shot: Path, **pose) -> Path:
    """A 1400 x 1000 screenshot of `page` after the clicks and hovers in `pose`."""
    posed = with_checks(page, shot.with_suffix(".html"), pose=True, **pose)
    done = browse(browser, posed, f"--screenshot={shot}")
    assert shot.is_file(), done.stderr[-2000:]
    return shot
