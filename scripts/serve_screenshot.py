"""Remake docs/serve.png: the page after a finished reading with the embedded model (a few minutes on 2 cores).

    .venv/bin/python scripts/serve_screenshot.py [docs/serve.png]

Starts `memagent serve` (embedded, 160-token chunks so the bundled example has several), drives Debian's
chromium with Playwright as tests/test_serve_page.py does, asks two questions about
memagent/examples/keeper_log.txt, moves the first timeline to chunk 2 and opens that chunk.
"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from servers import ServerProcess  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
out = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "docs" / "serve.png")
doc = (ROOT / "memagent" / "examples" / "keeper_log.txt").read_text()
with ServerProcess("--backend", "embedded", "--chunk-tokens", "160", "--memory-tokens", "64",
                   ready_timeout=180) as server, sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(server.root_url + "/")
    expect(page.locator("#template option").first).to_be_attached()
    page.fill("#doc", doc)
    page.fill("#questions", "How many steps does the tower have?\nWhat was the supply boat carrying?")
    page.click("#start")
    page.wait_for_selector("#answers .answer-item >> nth=1", timeout=900_000)
    panel = page.locator(".panel").nth(0)
    panel.locator(".timeline").evaluate("(s) => { s.value = 1; s.dispatchEvent(new Event('input')); }")
    panel.locator(".chunk-details summary").click()
    time.sleep(1)
    page.screenshot(path=out, full_page=True)
    browser.close()
print(out)
