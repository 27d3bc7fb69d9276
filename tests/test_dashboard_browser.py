"""The dashboard as a person sees it: a real Streamlit server on 127.0.0.1 and Debian's
headless Chromium (tests/browser/setup.sh installs it; never `playwright install`).

Visits every page of a run, saves full-page screenshots (paths printed) and checks what is on
the page: titles, the SIMULATION label, drawn charts (canvas/svg inside the vega element)
on the KV and TTFT pages, and no exception boxes."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

import dashboard
import synth

from dashboard import ui

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module", autouse=True)
def chromium_installed():
    # A missing browser fails these tests (like a missing dev cluster): a skip would pass
    # CI without ever looking at the pages.
    if not os.path.exists(CHROMIUM):
        pytest.fail("needs Debian's chromium: run `bash tests/browser/setup.sh` (as root)")
CHART = '[data-testid="stVegaLiteChart"]'
DRAWN = f"{CHART} canvas, {CHART} svg.marks"
# (url path, title on the page, minimum charts drawn, text that must be there). Tables are
# drawn on a canvas (glide grid), so the checked text is titles, metrics, captions, tabs.
PAGES = [
    ("", "Runs", 0, ["SIMULATION", "Simulated", "Failed"]),
    ("overview", "Run overview", 2, ["Total tok/s per GPU", "GSM8K accuracy",
                                     "Bottleneck per sweep point"]),
    ("sweep", "Sweep", 3, ["x = 1000 ÷ median TPOT", "Throughput measure"]),
    ("kv", "KV cache", 6, ["KV cache usage", "NIXL KV transfer (decode side)",
                           "KV capacity"]),
    ("ttft", "TTFT breakdown", 1, ["Diagnosis per sweep point", "healthy"]),
    ("gpus", "GPUs and hosts", 2, ["GPUs (NVML)", "GPU metric"]),
    ("logs", "Logs", 0, ["Processes with logs", "Tail"]),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    runs = {"healthy": synth.healthy(root), "failed": synth.failed(root),
            "large": synth.large(root, duration_s=1800.0)}
    port = free_port()
    log = open(root / "streamlit.log", "wb")
    proc = dashboard.start(root, host="127.0.0.1", port=port, stdout=log,
                           stderr=subprocess_stdout())
    base = dashboard.url("127.0.0.1", port)
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"streamlit did not start: {(root / 'streamlit.log').read_text()}")
        time.sleep(0.3)
    yield base, runs
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except Exception:  # noqa: BLE001 - a stuck server must not hang the suite
        proc.kill()
    log.close()


def subprocess_stdout():
    import subprocess

    return subprocess.STDOUT


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def visit(browser, url: str, title: str, min_charts: int, shot: Path) -> tuple[str, int]:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        page.goto(url, wait_until="domcontentloaded", timeout=60_000)
        page.get_by_role("heading", name=title).first.wait_for(timeout=90_000)
        if min_charts:
            page.wait_for_function(
                f"document.querySelectorAll('{DRAWN}').length >= {min_charts}",
                timeout=120_000)
        # Let the script finish: the status widget shows while Streamlit is running it.
        page.wait_for_function(
            "!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
        page.wait_for_timeout(800)  # vega finishes painting
        # Streamlit scrolls inside its main block, so "full page" is the viewport: grow the
        # viewport to the content's height to capture the whole page.
        h = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
        page.set_viewport_size({"width": 1440, "height": min(max(int(h), 1000), 12000)})
        page.wait_for_timeout(800)
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        assert page.locator('[data-testid="stException"]').count() == 0, \
            page.locator('[data-testid="stException"]').first.inner_text()
        return page.inner_text("body"), page.locator(DRAWN).count()
    finally:
        page.close()


@pytest.mark.parametrize("path, title, min_charts, wanted", PAGES,
                         ids=[p[0] or "runs" for p in PAGES])
def test_page_of_the_demo_run(server, browser, tmp_path_factory, path, title, min_charts,
                              wanted):
    base, runs = server
    run = runs["healthy"]
    shots = tmp_path_factory.getbasetemp() / "screenshots"
    shots.mkdir(exist_ok=True)
    text, drawn = visit(browser, f"{base}/{path}?run={run.name}", title, min_charts,
                        shots / f"healthy-{path or 'runs'}.png")
    assert drawn >= min_charts
    for w in wanted:
        assert w in text, f"{w!r} missing on {path or 'runs'}"
    if path:
        assert run.name in text and "SIMULATION" in text


def test_kv_and_ttft_pages_of_the_72_gpu_run(server, browser, tmp_path_factory):
    base, runs = server
    run = runs["large"]
    shots = tmp_path_factory.getbasetemp() / "screenshots"
    shots.mkdir(exist_ok=True)
    text, drawn = visit(browser, f"{base}/kv?run={run.name}", "KV cache", 7,
                        shots / "large-kv.png")
    assert "decode-1/e15" not in text  # engine labels live in the chart, not as page text
    assert "KV capacity" in text and drawn >= 7
    text, _ = visit(browser, f"{base}/ttft?run={run.name}", "TTFT breakdown", 1,
                    shots / "large-ttft.png")
    assert "decode KV capacity" in text


def test_failed_run_shows_the_error(server, browser, tmp_path_factory):
    base, runs = server
    run = runs["failed"]
    shots = tmp_path_factory.getbasetemp() / "screenshots"
    shots.mkdir(exist_ok=True)
    text, _ = visit(browser, f"{base}/overview?run={run.name}", "Run overview", 1,
                    shots / "failed-overview.png")
    assert "This run failed during stage" in text
    assert "illegal memory access" in text


def test_pages_listed_in_navigation(server, browser):
    base, runs = server
    page = browser.new_page()
    try:
        page.goto(f"{base}/?run={runs['healthy'].name}", timeout=60_000)
        nav = page.locator('[data-testid="stSidebarNav"]')
        nav.wait_for(timeout=60_000)
        listed = nav.inner_text()
        for _, title, _, _ in ui.PAGES:
            assert title in listed
        assert len(ui.PAGES) == len(PAGES)  # every page is visited above
    finally:
        page.close()
