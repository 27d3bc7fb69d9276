"""Waiting for a Streamlit page in Chromium to have finished drawing, instead of sleeping.

`open_page` opens a page that stamps the time of its last change (any DOM mutation, any
paint on a canvas: the tables are drawn on one). `drawn` then waits until Streamlit has
finished the script (its `data-test-script-state` and the status widget), nothing is still
loading (no skeleton), every visible chart has its SVG and fits its frame, every visible table has
drawn its text (on a page that records it in `window.__texts`), and nothing has changed for
`QUIET_MS`. The conditions are its own, not the tests' assertions: past its timeout it
returns and the caller's assertions read the page as it is, so they say what is wrong.
"""

from __future__ import annotations

CHART = '[data-testid="stVegaLiteChart"]'
QUIET_MS = 200  # nothing changed for this long: vega and the tables have painted
# Every change stamps window.__changed: DOM mutations (Streamlit's elements, vega's SVG) and
# paints on a canvas (glide's tables, which change no DOM when they draw).
CHANGES_JS = """(() => {
  if (window.__changed !== undefined) return;
  window.__changed = performance.now();
  const mark = () => { window.__changed = performance.now(); };
  new MutationObserver(mark).observe(document, {subtree: true, childList: true,
                                                attributes: true, characterData: true});
  const P = CanvasRenderingContext2D.prototype;
  for (const name of ['fillText', 'fillRect', 'fill', 'stroke', 'drawImage', 'putImageData',
                      'clearRect']) {
    const orig = P[name];
    P[name] = function (...a) { mark(); return orig.apply(this, a); };
  }
})()"""
DRAWN_JS = """([quietMs, since]) => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning' ||
      app.getAttribute('data-test-connection-state') !== 'CONNECTED') return false;
  if (document.querySelector('[data-testid="stStatusWidget"], [data-testid="stSkeleton"]'))
    return false;
  for (const c of document.querySelectorAll('CHART')) {  // drawn, at the frame's width
    if (!c.checkVisibility()) continue;  // in a tab not shown: vega draws it when shown
    const svg = c.querySelector('svg.marks');
    if (!svg && !c.querySelector('canvas')) return false;
    if (svg && svg.getBoundingClientRect().width > c.getBoundingClientRect().width + 1)
      return false;
  }
  if (window.__texts) {  // every visible table has drawn its text since __texts was reset
    const painted = new Set(window.__texts.filter(e => e.canvas.isConnected)
      .map(e => e.canvas.closest('[data-testid="stDataFrame"]')));
    for (const d of document.querySelectorAll('[data-testid="stDataFrame"]'))
      if (d.checkVisibility() && d.querySelector('canvas') && !painted.has(d)) return false;
  }
  return performance.now() - Math.max(window.__changed, since) >= quietMs;
}""".replace("'CHART'", repr(CHART))


def open_page(browser, url: str, viewport: dict, *init_scripts: str, **goto):
    """A new page (of a Browser or a BrowserContext) at `url` that stamps its changes
    (after running `init_scripts`)."""
    page = browser.new_page()
    page.set_viewport_size(viewport)
    for js in (*init_scripts, CHANGES_JS):
        page.add_init_script(js)
    page.goto(url, **{"timeout": 60_000, **goto})
    return page


def now(page) -> float:
    """The page's clock, for `drawn(since=...)`: take it before the change (a resize)."""
    return page.evaluate("performance.now()")


def drawn(page, *, since: float = 0.0, timeout_ms: int = 30_000) -> bool:
    """Wait until the page has finished drawing (see the module's docstring) and has been
    quiet since `since` too; False if not within `timeout_ms`, and the caller goes on."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.evaluate(CHANGES_JS)  # a page not opened by open_page starts stamping now
    try:
        page.wait_for_function(DRAWN_JS, arg=[QUIET_MS, since], timeout=timeout_ms)
        return True
    except PlaywrightTimeout:
        print(f"not drawn within {timeout_ms} ms: {page.url}")
        return False
